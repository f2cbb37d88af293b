"""What the strategies of one training graph on one device set share (``Planning``): the
starting graphs (data-parallel, micro-batched), their compiled problems, each placer's
schedules and their replays, each built once; and the helpers they are built with.
"""
from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
import time
from typing import Any, Callable, Sequence

from fastt.costs.source import CostSource
from fastt.errors import Declined, DoesNotFit, FasttError, NoBatch
from fastt.ir import Graph
from fastt.sched.allreduce import BUCKET_BYTES
from fastt.sched.bounds import Bound, least_shares, lower_bound
from fastt.sched.data_parallel import data_parallel
from fastt.sched.fitting import data_parallel_fitting
from fastt.sched.exact import TIME_LIMIT_S as EXACT_TIME_S
from fastt.sched.hybrid import BUDGET_S as hybrid_budget_s
from fastt.sched.hybrid import Weight, keep_whole, promising, weights
from fastt.sched.osdpos import Plan, clock, compiler
from fastt.sched.pipedream import micro_batch
from fastt.sched.problem import Device, Problem
from fastt.sched.registry import KINDS, StrategyKind
from fastt.sched.schedule import Schedule
from fastt.sched.simulate import replay_placement, replay_runs
from fastt.sched.splitting import Split, apply_splits
from fastt.sched.transfer_order import Prioritized, prioritize

log = logging.getLogger("fastt")


def feasible(attempts: list[Any]) -> list[Any]:
    """The results of the attempts (one per starting point) that fit; the first misfit
    when none does (e.g. the model graph fits no device, its data-parallel replicas do)."""
    results, errors = [], []
    for attempt in attempts:
        try:
            results.append(attempt())
        except (DoesNotFit, Declined) as e:
            errors.append(e)
    if errors and not results:
        raise errors[0]
    return results


def replay_schedule(p: Problem, s: Schedule) -> tuple[float, float]:
    """Schedule ``s`` of ``p`` simulated with free links and with one transfer at a time per
    link direction (makespans)."""
    return replay_placement(p, s.device, s.order())


Start = tuple[Graph, int, str]  # (graph, replicas, layout: "model" or a data-parallel one)
LAYOUTS = ("data-parallel", "data-parallel-ps")
MICRO_BATCHED = "micro-batched"  # the batch cut into micro-batches (pipelines)
MICRO_BATCHES = (1, 2, 4)  # per device: the micro-batch counts a pipeline is tried with
MICRO_OPS = 150_000  # the largest micro-batched graph built beyond the data-parallel one
HYBRID_SHARE = 1 / 3  # of what is left before a deadline: the most the hybrid search takes
SPLIT_SHARE = 1 / 2  # ... and the split search
EXACT_SHARE = 1 / 3  # ... and the exact program (building its rows included)
# Under a deadline a micro-batched graph of k times the devices is built only where a share
# of what is left pays about MICRO_COST * k times what the replicas took to build (it is then
# compiled, placed by PipeDream's cuts and replayed: RNNLM over 2x8 V100s, 32 micro-batches,
# 17.5 s where the replicas took 0.97 s)
MICRO_COST = 10.0


class Planning:
    """What the strategies of one training graph on one device set under one cost source
    share: the compiler, the starting graphs (the data-parallel ones take seconds to build
    on large models), each graph's compiled ``Problem``, each placer's schedule on it and
    each schedule's replay; each is built once. A strategy's plan time still counts what it
    used, built for it or before (``alone_s``): its time planned alone."""

    def __init__(self, graph: Graph, devices: Sequence[Device], costs: CostSource,
                 copy_bytes_per_s: float = 10e9, fetches: Sequence[str] = (),
                 bucket_bytes: float = BUCKET_BYTES, transfer_priorities: str = "auto",
                 deadline: float | None = None) -> None:
        if fetches:
            try:
                graph = graph.fan_in(fetches)
            except KeyError as e:
                raise FasttError(f"fetches name an op that is not in the graph: {e}") from None
        self.graph, self.devices, self.costs = graph, list(devices), costs
        self.fetches, self.bucket_bytes = list(fetches), bucket_bytes
        self.transfer_priorities = transfer_priorities
        self.pipelines = True  # False: OS-DPOS does not start from micro-batched graphs
        # when (``clock()``) the plan should be done (None: no limit): the searches (hybrid
        # plans, splits) take shares of what is left; what every plan needs is never cut
        self.deadline = deadline
        self._hybrid_ends: float | None = None  # when the hybrid searches must be done
        # the fastest plan replayed so far, one transfer at a time per link (``may_win``)
        self.best_s = math.inf
        self.compile_graph = compiler(self.devices, costs, graph, copy_bytes_per_s)
        # key -> (what was built or the misfit found, seconds, the objects its key names)
        self._built: dict[tuple[object, ...], tuple[Any, float, tuple[object, ...]]] = {}
        self._used: set[tuple[object, ...]] = set()
        self._fresh_s = 0.0  # seconds spent building since ``begin``
        # id(schedule) -> (the schedule, its placement's number, its plan's: ``_plan_id``)
        self._plans: dict[int, tuple[Schedule, int, int]] = {}
        self._contents: dict[tuple[object, ...], int] = {}

    def _get(self, key: tuple[object, ...], build: Any, keep: tuple[object, ...] = ()) -> Any:
        self._used.add(key)
        if key not in self._built:
            t0 = time.perf_counter()
            try:
                value = build()
            except (DoesNotFit, NoBatch, Declined) as e:
                value = e
            seconds = time.perf_counter() - t0
            self._fresh_s += seconds
            self._built[key] = (value, seconds, keep)
        value = self._built[key][0]
        if isinstance(value, Exception):
            raise value
        return value

    def begin(self) -> None:
        """A strategy's planning begins: what it uses is counted from here."""
        self._used, self._fresh_s = set(), 0.0

    def alone_s(self, wall_s: float) -> float:
        """The seconds a strategy that took ``wall_s`` since ``begin`` would have taken
        alone: its own work plus the building of everything it used."""
        return wall_s - self._fresh_s + sum(self._built[k][1] for k in self._used)

    def budget(self, own_s: float, share: float) -> float:
        """Seconds a search may take: its own budget ``own_s``, at most ``share`` of what is
        left before the deadline."""
        if self.deadline is None:
            return own_s
        return max(0.0, min(own_s, share * (self.deadline - clock())))

    def late(self, expected_s: float = 0.0) -> bool:
        """Whether work expected to take ``expected_s`` would end past the deadline."""
        return self.deadline is not None and clock() + expected_s >= self.deadline

    def may_win(self, times: tuple[float, float]) -> bool:
        """Whether ordering the weight transfers of a plan replayed in ``times`` (free
        links, one transfer at a time) is worth its time: always without a deadline; under
        one, only while its replay with free links is faster than the fastest plan replayed
        so far. Ordering transfers adds gates and takes no wait away, so (list scheduling's
        anomalies aside) the plan cannot then end faster than with free links."""
        return self.deadline is None or times[0] < self.best_s

    def _known(self, key: tuple[object, ...]) -> bool:
        return key in self._built

    def candidate_s(self, g: Graph) -> float:
        """What compiling ``g`` and placing it with DPOS took (0 where not done): about what
        one of the split search's candidates on ``g`` takes."""
        return sum(self._built[k][1] for k in (("compile", id(g)), ("place", "dpos", id(g)))
                   if k in self._built)

    def finish_s(self, p: Problem) -> float:
        """About what finishing a plan of ``p`` takes (its replays, its weight transfers
        ordered): what compiling a graph of its size takes, at the slowest rate per op of the
        compiles so far."""
        rates = [seconds / v.n for k, (v, seconds, _) in self._built.items()
                 if k[0] == "compile" and isinstance(v, Problem) and v.n]
        return max(rates, default=0.0) * p.n

    def compile(self, g: Graph) -> Problem:
        """``g`` compiled."""
        return self._get(("compile", id(g)), lambda: self.compile_graph(g), (g,))

    def place(self, k: StrategyKind, g: Graph) -> Schedule:
        """Placer ``k``'s schedule of ``g`` (``DoesNotFit`` each time when it does not); a
        placer with a time limit (the exact program) gets its own, or a share of what is
        left before the deadline."""
        p = self.compile(g)

        def run() -> Schedule:
            if not k.timed:
                return k.place(p, g)
            seconds = self.budget(EXACT_TIME_S, EXACT_SHARE)
            if seconds < 1.0:
                raise Declined(f"no time left for {k.name} ({seconds:.1f} s of the plan's "
                               "budget)")
            return k.place(p, g, seconds)  # type: ignore[call-arg]
        return self._get(("place", k.name, id(g)), run, (g,))

    def place_aside(self, jobs: Sequence[tuple[StrategyKind, Graph]]) -> Callable[[], None]:
        """Start placing each graph of ``jobs`` with its placer in a forked process, while
        this one builds something else (the all-reduce layout): the call returned waits for
        them and keeps them as if placed here. Does nothing where there is no second core or
        no fork, or nothing to place."""
        global _ASIDE
        todo = [(k, g) for k, g in jobs
                if not k.timed and not self._known(("place", k.name, id(g)))]
        if not todo or (os.cpu_count() or 1) < 2 or "fork" not in mp.get_all_start_methods():
            return lambda: None
        for g in {id(g): g for _, g in todo}.values():
            self.compile(g)  # here, so that both processes hold the same problems
        _ASIDE = (self, todo)
        try:
            pool = mp.get_context("fork").Pool(1)
        finally:
            _ASIDE = None
        pending = pool.apply_async(_place_aside)

        def join() -> None:
            try:
                for (k, g), (value, seconds) in zip(todo, pending.get()):
                    self._built.setdefault(("place", k.name, id(g)), (value, seconds, (g,)))
            except Exception as e:  # noqa: BLE001 - placed here instead, when asked
                log.debug("placing aside failed (%s); placing here", e)
            finally:
                pool.close()
                pool.join()
        return join

    def bound(self) -> Bound:
        """A lower bound on the step time of any plan of the graph on the devices
        (``fastt.sched.bounds``)."""
        D, shared = len(self.devices), None
        if D > 1:
            try:
                shared = self._get(("replicas",), lambda: data_parallel(self.graph, D))
            except NoBatch:
                pass
        p = self.compile(self.graph)
        return lower_bound(p, least_shares(self.graph, D, shared),
                           step_overhead(self.costs) + min(p.reach, default=0.0))

    def replay(self, p: Problem, s: Schedule) -> tuple[float, float]:
        """Schedule ``s`` of ``p`` simulated with free links and with one transfer at a
        time per link direction."""
        return self._replayed(p, s, True)[0]

    def replay_fifo(self, p: Problem, s: Schedule) -> tuple[float, float]:
        """``replay`` of ``s``'s placement with no order enforced (first come, first
        served)."""
        return self._replayed(p, s, False)[0]

    def replayed_fifo(self, p: Problem, s: Schedule) -> bool:
        """Whether ``replay_fifo`` of ``s`` is known already (costs nothing)."""
        return self._known(_replay_key(p, self._plan_id(s, False), False))

    def _replayed(self, p: Problem, s: Schedule, ordered: bool
                  ) -> tuple[tuple[float, float], list[float]]:
        """``replay`` (``ordered``) or ``replay_fifo``, and each op's start with free links
        (when the weights are ordered by need, that is when each is needed)."""
        def run() -> tuple[tuple[float, float], list[float]]:
            free, queued = replay_runs(p, s.device, s.order() if ordered else None)
            self.best_s = min(self.best_s, queued.makespan)  # a plan that runs so fast
            return (free.makespan, queued.makespan), free.start
        return self._get(_replay_key(p, self._plan_id(s, ordered), ordered), run, (p, s))

    def prioritized(self, g: Graph, p: Problem, s: Schedule, ordered: bool,
                    times: tuple[float, float]) -> Prioritized | None:
        """Schedule ``s`` of ``g`` (compiled as ``p``, replayed in ``times``) with its weight
        transfers ordered by need where that pays (``fastt.sched.transfer_order``); the
        strategies that finish the same schedule share it."""
        key = _prioritized_key(p, self._plan_id(s, ordered), ordered)

        def build() -> Prioritized | None:
            found = prioritize(g, p, s.device, s.order(), ordered, self.compile_graph, times,
                               self.transfer_priorities, self._replayed(p, s, ordered)[1])
            if found is not None:
                self.best_s = min(self.best_s, found.times[1])
            return found
        return self._get(key, build, (g, p, s))

    def was_prioritized(self, p: Problem, s: Schedule, ordered: bool) -> bool:
        """Whether ``prioritized`` of ``s`` is known already (costs nothing)."""
        return self._known(_prioritized_key(p, self._plan_id(s, ordered), ordered))

    def _plan_id(self, s: Schedule, ordered: bool) -> int:
        """A number per distinct plan: ``s``'s placement, and with ``ordered`` its order;
        equal for equal schedules, so that two strategies ending on the same plan (PipeDream's
        one stage replicated on every device and TF-slim's data parallelism, on the same
        replicas) replay it and order its transfers once."""
        known = self._plans.get(id(s))
        if known is None:  # s is kept with its numbers: its id stays its own
            placed, planned = (self._contents.setdefault(c, len(self._contents))
                               for c in (tuple(s.device), (tuple(s.device), tuple(s.order()))))
            known = self._plans[id(s)] = (s, placed, planned)
        return known[2] if ordered else known[1]

    def layout(self, layout: str) -> Start:
        """The data-parallel starting graph of ``layout`` over the devices; ``NoBatch`` or
        ``DoesNotFit`` (every time) when there is none."""
        D = len(self.devices)
        replicas = self._get(("replicas",), lambda: data_parallel(self.graph, D))

        def build() -> Start:
            dp = data_parallel_fitting(self.graph, self.devices, layout == "data-parallel",
                                       self.bucket_bytes, replicas, self.compile)
            if dp is None:
                raise DoesNotFit("data parallelism needs every replica (the model with its "
                                 f"share of the batch) to fit one device ({D} devices given)")
            return (dp, D, layout)
        return self._get(("layout", layout), build)

    def hybrid(self, layout: str) -> Start:
        """``layout``'s data-parallel start with the weights kept whole (``fastt.sched.hybrid``)
        that shorten its simulated step; ``Declined`` when none does."""
        D = len(self.devices)

        def graph_of(whole: frozenset[str]) -> Graph | None:
            try:
                if not whole:
                    return self.layout(layout)[0]
                return data_parallel_fitting(self.graph, self.devices, layout == "data-parallel",
                                             self.bucket_bytes,
                                             data_parallel(self.graph, D, whole), self.compile)
            except DoesNotFit:
                return None

        def step_time(g: Graph) -> float:
            k = KINDS[layout]  # the layout's own placer: its schedule and replay shared
            return self.replay(self.compile(g), self.place(k, g))[1]

        def build() -> Start:
            p0 = self.compile(self.graph)
            slowest = max(p0.slope[a][b] for a in range(D) for b in range(D) if a != b)
            cands = promising(self.weights(), lambda w: sum(
                p0.w[p0.index[o]][0] for o in w.ops if o in p0.index), slowest, D)
            # a candidate costs about what the layout took to build and replay
            built = sum(self._built[k][1] for k in (("replicas",), ("layout", layout))
                        if k in self._built)
            if self.deadline is None:
                budget_s = hybrid_budget_s
            else:  # one share of what is left for both layouts' searches
                if self._hybrid_ends is None:
                    self._hybrid_ends = clock() + self.budget(hybrid_budget_s, HYBRID_SHARE)
                budget_s = max(0.0, self._hybrid_ends - clock())
            if cands and built > budget_s:
                raise Declined(f"no time left to keep weights whole in {layout} (a candidate "
                               f"takes about {built:.0f} s; {budget_s:.0f} s left for it)")
            g, kept = keep_whole(cands, graph_of, step_time, candidate_s=built,
                                 budget_s=budget_s) if cands else (None, [])
            if g is None or not kept:
                raise Declined(f"no weight pays to keep whole in {layout}")
            log.info("hybrid %s: %s kept whole", layout, ", ".join(w.variable for w in kept))
            return (g, D, layout)
        return self._get(("hybrid", layout), build)

    def weights(self) -> list[Weight]:
        """The graph's weights (``fastt.sched.hybrid.weights``)."""
        return self._get(("weights",), lambda: weights(self.graph))

    def micro_batched(self) -> list[Start]:
        """The graph with its batch cut into m micro-batches, for each m of
        ``MICRO_BATCHES`` times the devices that the batch allows (none: ``NoBatch``), and
        beyond the data-parallel graph (m = the devices) of at most ``MICRO_OPS`` ops and,
        under a deadline, only where a share of what is left pays for it (``MICRO_COST``)."""
        out: list[Start] = []
        for times in MICRO_BATCHES:
            m = times * len(self.devices)
            if times > 1 and m * len(self.graph) > MICRO_OPS:
                break
            if times > 1 and ("micro", m) not in self._built and self.deadline is not None:
                cost = MICRO_COST * times * self._built[("replicas",)][1]
                if cost > self.budget(cost, HYBRID_SHARE):
                    log.info("no time left for %d micro-batches (about %.0f s)", m, cost)
                    break
            try:  # D micro-batches: the data-parallel replicas
                g = self._get(("replicas",) if m == len(self.devices) else ("micro", m),
                              lambda: data_parallel(self.graph, m))
            except NoBatch:
                break
            out.append((g, m, MICRO_BATCHED))
        if not out:
            raise NoBatch(f"the batch cannot be cut into {len(self.devices)} micro-batches")
        return out

    def micro_batched_plans(self, plan: Plan) -> list[tuple[Plan, int]]:
        """``plan`` (of the model graph) over each micro-batched graph: every part of an op
        on the op's device (``fastt.sched.pipedream.micro_batch``), and its micro-batches;
        past the deadline, only those placed already."""
        p0 = plan.problem
        placed = {p0.names[i]: plan.schedule.device[i] for i in range(p0.n)}
        out = []
        for g, m, _ in self.micro_batched():
            key = ("micro-placed", id(plan.schedule), id(g))
            if self.late() and not self._known(key):
                continue
            p = self.compile(g)
            note = f"a placement of the model graph over {m} micro-batches"
            try:
                out.append((Plan(g, p, self._get(
                    key, lambda: micro_batch(p, g, placed, note), (plan.schedule, g))), m))
            except DoesNotFit:
                pass
        return out

    def starts(self, k: StrategyKind, forced: list[Split]) -> list[Start]:
        """Where strategy ``k`` starts, the data-parallel graphs first."""
        if forced:  # a split list names the user's ops: it starts from the model graph
            if k.starts in LAYOUTS:
                raise FasttError("a split list cannot be combined with the data-parallel "
                                 "strategy; plan it with dpos or os-dpos")
            return [(apply_splits(self.graph, forced), 1, "model")]
        if k.starts in LAYOUTS:
            return [self.layout(k.starts)] if len(self.devices) > 1 else []
        if k.starts == MICRO_BATCHED:
            return self.micro_batched()
        starts: list[Start] = []
        if k.starts != "model" and len(self.devices) > 1:
            for layout in LAYOUTS:
                attempts = [self.layout] + [self.hybrid] * k.search
                for attempt in attempts:  # OS-DPOS also starts from the hybrid plans
                    try:
                        starts.append(attempt(layout))
                    except (NoBatch, DoesNotFit, Declined):
                        pass
            if k.search and self.pipelines:  # OS-DPOS also starts from the pipelines
                try:
                    starts += self.micro_batched()
                except NoBatch:
                    pass
        return starts + [(self.graph, 1, "model")]


# the planning a forked process places for, and what (``place_aside``)
_ASIDE: tuple[Planning, list[tuple[StrategyKind, Graph]]] | None = None


def _place_aside() -> list[tuple[Any, float]]:
    """In ``place_aside``'s process: each job placed as ``Planning.place`` does, and what it
    kept (the schedule or the misfit found, and the seconds it took)."""
    assert _ASIDE is not None
    shared, todo = _ASIDE
    for k, g in todo:
        try:
            shared.place(k, g)
        except (DoesNotFit, NoBatch, Declined):
            pass
    return [shared._built[("place", k.name, id(g))][:2] for k, g in todo]


def step_overhead(costs: CostSource) -> float:
    """What a step takes beyond its ops and transfers, when ``costs`` knows it (else 0)."""
    known = getattr(costs, "step_overhead", None)
    return float(known()) if known else 0.0


def _replay_key(p: Problem, plan: int, ordered: bool) -> tuple:
    """The cache key of ``Planning._replayed`` (``plan``: ``Planning._plan_id``)."""
    return ("replay" if ordered else "fifo", id(p), plan)


def _prioritized_key(p: Problem, plan: int, ordered: bool) -> tuple:
    """The cache key of ``Planning.prioritized`` (``plan``: ``Planning._plan_id``)."""
    return ("prioritized", id(p), plan, ordered)
