"""What the strategies of one training graph on one device set share (``Planning``): the
graphs they start from (built by ``fastt.sched.search.starts``), their compiled problems, each
placer's schedules and their replays, each built once; the plan's budget; and the helpers
they are built with.
"""
from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
from typing import Any, Callable, Mapping, Sequence

from fastt.costs.source import CostSource
from fastt.errors import Declined, DoesNotFit, FasttError, NoBatch
from fastt.ir import Graph
from fastt.passes.allreduce import BUCKET_BYTES
from fastt.sched.search.bounds import Bound, least_shares, lower_bound
from fastt.passes.data_parallel import data_parallel
from fastt.sched.placers.exact import TIME_LIMIT_S as EXACT_TIME_S
from fastt.sched.search.osdpos import clock, compiler
from fastt.sched.sim.problem import Device, Problem
from fastt.sched.registry import StrategyKind
from fastt.sched.sim.schedule import Schedule
from fastt.sched.sim.simulate import replay_placement, replay_runs
from fastt.sched.placers.transfer_order import Prioritized, prioritize

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


SPLIT_SHARE = 1 / 2  # of what is left before a deadline: the most the split search takes
# Of the time left when planning begins, what the searches and finishes leave before the
# deadline: work begun before it whose estimate was short ends in it, not past the deadline
RESERVE_SHARE = 0.05
EXACT_SHARE = 1 / 3  # ... and the exact program (building its rows included)


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
        # when (``clock()``) the searches and finishes aim to be done (None: no limit): the
        # deadline less its reserve (``RESERVE_SHARE``); the searches (hybrid plans, splits)
        # take shares of what is left; what every plan needs is never cut
        self.deadline = None if deadline is None else \
            deadline - RESERVE_SHARE * max(0.0, deadline - clock())
        self.hybrid_ends: float | None = None  # when the hybrid searches must be done
        # the fastest plan replayed so far, one transfer at a time per link (``may_win``)
        self.best_s = math.inf
        self.compile_graph = compiler(self.devices, costs, graph, copy_bytes_per_s)
        # key -> (what was built or the misfit found, seconds, the objects its key names)
        self._built: dict[tuple[object, ...], tuple[Any, float, tuple[object, ...]]] = {}
        # key -> the key whose building built it (``built_s`` counts the work once)
        self._within: dict[tuple[object, ...], tuple[object, ...]] = {}
        self._building: list[tuple[object, ...]] = []
        self._used: set[tuple[object, ...]] = set()
        self._fresh_s = 0.0  # seconds spent building since ``begin``
        # id(schedule) -> (the schedule, its placement's number, its plan's: ``_plan_id``)
        self._plans: dict[int, tuple[Schedule, int, int]] = {}
        self._contents: dict[tuple[object, ...], int] = {}

    def cached(self, key: tuple[object, ...], build: Callable[[], Any],
               keep: tuple[object, ...] = ()) -> Any:
        """What ``build()`` returns (or raises: a misfit, a decline), built once per ``key``
        (``keep``: the objects whose ids the key names, kept alive with it) and counted as
        used by the strategy being planned."""
        self._used.add(key)
        if key not in self._built:
            t0 = clock()
            if self._building:
                self._within[key] = self._building[-1]
            self._building.append(key)
            try:
                value = build()
            except (DoesNotFit, NoBatch, Declined) as e:
                value = e
            finally:
                self._building.pop()
            seconds = clock() - t0
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

    def known(self, key: tuple[object, ...]) -> bool:
        """Whether what ``key`` names is built already (costs nothing)."""
        return key in self._built

    def built_s(self, *keys: tuple[object, ...]) -> float:
        """The seconds building what ``keys`` name took (0 for what is not built), each
        piece of work once: a key built while building another of them is in that one's."""
        named = set(keys)

        def inside(k: tuple[object, ...]) -> bool:
            up = self._within.get(k)
            while up is not None:
                if up in named:
                    return True
                up = self._within.get(up)
            return False
        return sum(self._built[k][1] for k in named if k in self._built and not inside(k))

    def plan_keys(self, k: StrategyKind, g: Graph) -> list[tuple[object, ...]]:
        """What compiling ``g``, placing it with placer ``k`` and replaying that schedule
        are kept under (for ``built_s``)."""
        keys: list[tuple[object, ...]] = [("compile", id(g)), ("place", k.name, id(g))]
        problem, placed = self._built.get(keys[0]), self._built.get(keys[1])
        if problem is not None and placed is not None and isinstance(placed[0], Schedule):
            keys.append(self._replay_key(problem[0], placed[0], True))
        return keys

    def replicas(self) -> Graph:
        """The graph's data-parallel replicas over the devices (``NoBatch`` each time when
        the batch cannot be cut)."""
        return self.cached(("replicas",), lambda: data_parallel(self.graph, len(self.devices)))

    def candidate_s(self, g: Graph) -> float:
        """What compiling ``g`` and placing it with DPOS took (0 where not done): about what
        one of the split search's candidates on ``g`` takes."""
        return self.built_s(("compile", id(g)), ("place", "dpos", id(g)))

    def finish_s(self, p: Problem) -> float:
        """About what finishing a plan of ``p`` takes (its replays, its weight transfers
        ordered): what compiling a graph of its size takes, at the rate per op of the
        largest compile so far (a small one's rate counts its fixed costs, and the wait for
        costs computed on another core)."""
        done = [(v.n, seconds) for k, (v, seconds, _) in self._built.items()
                if k[0] == "compile" and isinstance(v, Problem) and v.n]
        n, seconds = max(done, default=(1, 0.0))
        return seconds / n * p.n

    def compile(self, g: Graph) -> Problem:
        """``g`` compiled."""
        return self.cached(("compile", id(g)), lambda: self.compile_graph(g), (g,))

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
        return self.cached(("place", k.name, id(g)), run, (g,))

    def place_aside(self, jobs: Sequence[tuple[StrategyKind, Graph]]) -> Callable[[], None]:
        """Start placing each graph of ``jobs`` with its placer in a forked process, while
        this one builds something else (the all-reduce layout): the call returned waits for
        them and keeps them as if placed here. Does nothing where there is no second core or
        no fork, or nothing to place."""
        global _ASIDE
        todo = [(k, g) for k, g in jobs
                if not k.timed and not self.known(("place", k.name, id(g)))]
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
                for (k, g), (value, seconds, replayed) in zip(todo, pending.get()):
                    self._built.setdefault(("place", k.name, id(g)), (value, seconds, (g,)))
                    if replayed is not None:  # its replay too, kept under this one's keys
                        p = self.compile(g)
                        times, replay_s = replayed
                        self.best_s = min(self.best_s, times[0][1])
                        self._built.setdefault(
                            self._replay_key(p, value, True),
                            (times, replay_s, (p, value)))
            except Exception as e:  # noqa: BLE001 - placed here instead, when asked
                log.debug("placing aside failed (%s); placing here", e)
            finally:
                pool.close()
                pool.join()
        return join

    def bound(self) -> Bound:
        """A lower bound on the step time of any plan of the graph on the devices
        (``fastt.sched.search.bounds``)."""
        D, shared = len(self.devices), None
        if D > 1:
            try:
                shared = self.replicas()
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
        return self.known(self._replay_key(p, s, False))

    def _replayed(self, p: Problem, s: Schedule, ordered: bool
                  ) -> tuple[tuple[float, float], list[float]]:
        """``replay`` (``ordered``) or ``replay_fifo``, and each op's start with free links
        (when the weights are ordered by need, that is when each is needed)."""
        def run() -> tuple[tuple[float, float], list[float]]:
            free, queued = replay_runs(p, s.device, s.order() if ordered else None)
            self.best_s = min(self.best_s, queued.makespan)  # a plan that runs so fast
            return (free.makespan, queued.makespan), free.start
        return self.cached(self._replay_key(p, s, ordered), run, (p, s))

    def prioritized(self, g: Graph, p: Problem, s: Schedule, ordered: bool,
                    times: tuple[float, float]) -> Prioritized | None:
        """Schedule ``s`` of ``g`` (compiled as ``p``, replayed in ``times``) with its weight
        transfers ordered by need where that pays (``fastt.sched.placers.transfer_order``); the
        strategies that finish the same schedule share it."""
        key = _prioritized_key(p, self._plan_id(s, ordered), ordered)

        def build() -> Prioritized | None:
            found = prioritize(g, p, s.device, s.order(), ordered, self.compile_graph, times,
                               self.transfer_priorities, self._replayed(p, s, ordered)[1])
            if found is not None:
                self.best_s = min(self.best_s, found.times[1])
            return found
        return self.cached(key, build, (g, p, s))

    def was_prioritized(self, p: Problem, s: Schedule, ordered: bool) -> bool:
        """Whether ``prioritized`` of ``s`` is known already (costs nothing)."""
        return self.known(_prioritized_key(p, self._plan_id(s, ordered), ordered))

    def _replay_key(self, p: Problem, s: Schedule, ordered: bool) -> tuple:
        """What ``_replayed`` keeps schedule ``s`` of ``p``'s replay under."""
        return ("replay" if ordered else "fifo", id(p), self._plan_id(s, ordered))

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

# the planning a forked process places for, and what (``place_aside``)
_ASIDE: tuple[Planning, list[tuple[StrategyKind, Graph]]] | None = None


def _place_aside() -> list[tuple[Any, float, Any]]:
    """In ``place_aside``'s process: each job placed as ``Planning.place`` does, and what it
    kept (the schedule or the misfit found, and the seconds it took), with the schedule's
    replay as ``Planning.replay`` keeps it and its seconds (None for a misfit)."""
    assert _ASIDE is not None
    shared, todo = _ASIDE
    out: list[tuple[Any, float, Any]] = []
    for k, g in todo:
        placed = ("place", k.name, id(g))
        try:
            s = shared.place(k, g)
        except (DoesNotFit, NoBatch, Declined):
            out.append((*shared._built[placed][:2], None))
            continue
        p = shared.compile(g)
        shared.replay(p, s)
        out.append((*shared._built[placed][:2],
                    shared._built[shared._replay_key(p, s, True)][:2]))
    return out


def step_overhead(costs: CostSource, placement: Mapping[str, str] | None = None) -> float:
    """What a step of ``placement`` takes beyond its ops and transfers, when ``costs`` knows
    it (else 0); None: the least over the ways a step spreads (a bound)."""
    return float(costs.step_overhead(None if placement is None
                                     else len(set(placement.values()))))


def _prioritized_key(p: Problem, plan: int, ordered: bool) -> tuple:
    """The cache key of ``Planning.prioritized`` (``plan``: ``Planning._plan_id``)."""
    return ("prioritized", id(p), plan, ordered)
