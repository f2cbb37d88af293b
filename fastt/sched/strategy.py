"""Strategies: one entry point for every placer, and the strategy document they produce.

``plan(graph, devices, costs, name)`` returns a ``Strategy``: the graph it refers to (the
data-parallel graph and splits included), the split list, a device for every op, the execution
order, and the predicted step time. The strategies are those of ``fastt.sched.registry``.
``dpos`` and ``os-dpos`` run from the data-parallel graph when every replica fits its device
(FastT's choice: never worse than data parallelism) and from the model graph, and keep the
faster plan (so never worse than DPOS on the model either). OS-DPOS also starts from every
other list scheduler of the registry (the data-parallel layout; one device, HEFT, m-TOPO, m-ETF
and m-SCT on the model graph; PipeDream on the graph cut into micro-batches; not the exact
program, a strategy of its own with a time limit), splits from the fastest starting plan,
and of its starting plans and its split plan returns the one fastest when links carry one
transfer at a time: so it is never simulated slower than any of them, by construction
(``dpos`` stays pure DPOS). ``heft``, ``m-topo``, ``m-etf``, ``m-sct``, ``exact`` and
``single`` place the model graph, as their papers do;
``data-parallel`` puts replica k on device k and the shared ops (updates, whole-batch ops) on
device 0; ``pipedream`` cuts the batch into 1, 2 and 4 micro-batches per device and keeps
the fastest of its pipelines (``fastt.sched.pipedream``).

Every strategy's step time is predicted the same way: its placement and per-device order
replayed by the simulator with contention-free links (``predicted_step_time_s``, the model
DPOS optimises) and with one transfer at a time per link direction
(``simulated_step_time_s``).

Strategies planned for the same graph, devices and costs share a ``Planning``: the
data-parallel graphs, compiled problems, placements and replays are built once for all.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from fastt.costs.memory import MemoryModel
from fastt.costs.source import CostSource
from fastt.devices import same_process
from fastt.errors import Declined, DoesNotFit, FasttError, NoBatch
from fastt.ir import Graph
from fastt.sched import baselines
from fastt.sched._gc import without_gc
from fastt.sched.allreduce import BUCKET_BYTES, all_reduce
from fastt.sched.bounds import Bound, least_shares, lower_bound
from fastt.sched.data_parallel import data_parallel
from fastt.sched.osdpos import Plan, compiler, os_dpos
from fastt.sched.problem import Device, Problem
from fastt.sched.registry import KINDS, StrategyKind, kind
from fastt.sched.schedule import Schedule
from fastt.sched.simulate import SimResult, replay_placement, simulate, simulate_fifo
from fastt.sched.splitting import Split, apply_splits
from fastt.sched.transfer_order import prioritize

SCHEMA_VERSION = 1


@dataclass
class Strategy:
    name: str
    devices: list[str]
    graph: Graph
    placement: dict[str, str]
    order: list[str]
    predicted_step_time_s: float
    simulated_step_time_s: float
    plan_time_s: float
    splits: list[Split] = field(default_factory=list)
    replicas: int = 1
    dpos_runs: int = 0
    fetches: list[str] = field(default_factory=list)  # the training step it was planned for
    note: str = ""  # what its placer said of it (the exact program: optimal, or its gap)
    # False: TensorFlow's own first-come order runs the placement faster than ``order``
    # (the step times are then that order's)
    ordered: bool = True
    # its weight transfers ordered by need (``fastt.sched.transfer_order``): what was found
    # and whether it was kept (None: no link carries two groups of weights, or switched off)
    transfer_priorities: dict[str, Any] | None = None

    def ops_per_device(self) -> dict[str, int]:
        counts = {d: 0 for d in self.devices}
        for d in self.placement.values():
            counts[d] += 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "strategy": self.name,
                "devices": self.devices, "replicas": self.replicas,
                "predicted_step_time_s": self.predicted_step_time_s,
                "simulated_step_time_s": self.simulated_step_time_s,
                "plan_time_s": self.plan_time_s, "dpos_runs": self.dpos_runs,
                "splits": [s.to_list() for s in self.splits],
                "split_details": [s.details() for s in self.splits], "fetches": self.fetches,
                "placement": self.placement, "order": self.order, "ordered": self.ordered,
                "transfer_priorities": self.transfer_priorities, "note": self.note}


def peak_memory_one_device(graph: Graph) -> float:
    """Bytes the graph needs on one device: variables plus the peak of live outputs when its
    ops run one after another in topological order (a unit of time each). Outputs of
    aliasing ops (Identity, ReadVariableOp...) are counted too: an over-estimate."""
    mem = MemoryModel.from_graph(graph)
    dev = [Device("/job:localhost/replica:0/task:0/device:CPU:0")]
    p = Problem.from_graph(graph, dev, _UnitCosts(), persistent=mem.persistent)
    return simulate(p, [0] * p.n, [p.topo]).peak_memory[0]


class _UnitCosts:
    def compute(self, op: str, device: str) -> float:
        return 1.0

    def link(self, src: str, dst: str) -> tuple[float, float]:
        return (0.0, 0.0)


def nccl(devices: Sequence[Device]) -> bool:
    """Whether the all-reduce over ``devices`` is NCCL's: GPUs, all in one process."""
    return all(d.type == "GPU" and same_process(d.name, devices[0].name) for d in devices)


def data_parallel_fitting(graph: Graph, devices: Sequence[Device], ring: bool = True,
                          bucket_bytes: float = BUCKET_BYTES, replicas: Graph | None = None
                          ) -> Graph | None:
    """The data-parallel graph over ``devices`` when every device holds its replica (each
    with its share of the batch; with ``ring``, mirrored variables and ring all-reduce, else
    gradients summed on device 0; ``bucket_bytes``: the all-reduce's fusion buckets), else
    None. ``replicas``: ``data_parallel(graph, len(devices))`` when the caller has it. Memory
    is the simulated peak of the replicas' placement, ops in topological order."""
    D = len(devices)
    dp = replicas if replicas is not None else data_parallel(graph, D)
    if ring:
        dp = all_reduce(dp, D, bucket_bytes, collective=nccl(devices))
    if all(d.memory == math.inf for d in devices):
        return dp
    mem = MemoryModel.from_graph(dp)
    p = Problem.from_graph(dp, devices, _UnitCosts(), persistent=mem.persistent)
    device = baselines.data_parallel(p, dp).device
    orders: list[list[int]] = [[] for _ in range(D)]
    for i in p.topo:  # as peak_memory_one_device: each device in topological order
        orders[device[i]].append(i)
    peaks = simulate(p, device, orders).peak_memory
    return dp if all(m <= d.memory for m, d in zip(peaks, devices)) else None


def _feasible(attempts: list[Any]) -> list[Any]:
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


def _replay_fifo(p: Problem, s: Schedule) -> tuple[float, float]:
    """``replay_schedule`` of ``s``'s placement in TensorFlow's own first-come order."""
    return replay_placement(p, s.device, None)


def plan(graph: Graph, devices: Sequence[Device], costs: CostSource,
         name: str = "os-dpos", copy_bytes_per_s: float = 10e9, workers: int = 1,
         fetches: Sequence[str] = (), splits: Sequence[Split] = (), split: bool = True,
         bucket_bytes: float = BUCKET_BYTES, shared: Planning | None = None,
         transfer_priorities: str = "auto") -> Strategy:
    """Compute strategy ``name`` (``fastt.sched.registry``) for ``graph`` on ``devices``
    under ``costs``; ops fastt adds (split, concat, sum) copy ``copy_bytes_per_s`` on a
    device; OS-DPOS evaluates candidate splits on ``workers`` processes. With ``fetches`` (a
    training step's train op and loss) only what they run is planned; initializers, savers and
    the like are left out. ``splits`` (of the user's ops, e.g. a saved strategy's) are applied
    to the model graph first; with ``split=False`` OS-DPOS keeps its starting plan (DPOS or
    data parallel, no splits); ``bucket_bytes``: the size of the all-reduce's gradient
    buckets; ``transfer_priorities``: "auto" orders the weight transfers by need where the
    simulator predicts it faster, "on" always, "off" never (``fastt.sched.transfer_order``).
    ``shared``: what strategies planned before for the same graph, devices and
    costs built (``Planning``); given, it stands for the other arguments but ``name``,
    ``workers``, ``splits`` and ``split``. ``DoesNotFit`` when no starting point fits the
    devices."""
    k = kind(name)
    if shared is None:
        shared = Planning(graph, devices, costs, copy_bytes_per_s, fetches, bucket_bytes,
                          transfer_priorities)
    result = _plan(shared, k, workers, list(splits), split)
    result.fetches = list(shared.fetches)
    return result


Start = tuple[Graph, int, str]  # (graph, replicas, layout: "model" or a data-parallel one)
LAYOUTS = ("data-parallel", "data-parallel-ps")
MICRO_BATCHED = "micro-batched"  # the batch cut into micro-batches (pipelines)
MICRO_BATCHES = (1, 2, 4)  # per device: the micro-batch counts a pipeline is tried with
MICRO_OPS = 150_000  # the largest micro-batched graph built beyond the data-parallel one


class Planning:
    """What the strategies of one training graph on one device set under one cost source
    share: the compiler, the starting graphs (the data-parallel ones take seconds to build
    on large models), each graph's compiled ``Problem``, each placer's schedule on it and
    each schedule's replay; each is built once. A strategy's plan time still counts what it
    used, built for it or before (``alone_s``): its time planned alone."""

    def __init__(self, graph: Graph, devices: Sequence[Device], costs: CostSource,
                 copy_bytes_per_s: float = 10e9, fetches: Sequence[str] = (),
                 bucket_bytes: float = BUCKET_BYTES, transfer_priorities: str = "auto"
                 ) -> None:
        if fetches:
            try:
                graph = graph.fan_in(fetches)
            except KeyError as e:
                raise FasttError(f"fetches name an op that is not in the graph: {e}") from None
        self.graph, self.devices, self.costs = graph, list(devices), costs
        self.fetches, self.bucket_bytes = list(fetches), bucket_bytes
        self.transfer_priorities = transfer_priorities
        self.compile_graph = compiler(self.devices, costs, graph, copy_bytes_per_s)
        # key -> (what was built or the misfit found, seconds, the objects its key names)
        self._built: dict[tuple[object, ...], tuple[Any, float, tuple[object, ...]]] = {}
        self._used: set[tuple[object, ...]] = set()
        self._fresh_s = 0.0  # seconds spent building since ``begin``

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

    def compile(self, g: Graph) -> Problem:
        """``g`` compiled."""
        return self._get(("compile", id(g)), lambda: self.compile_graph(g), (g,))

    def place(self, k: StrategyKind, g: Graph) -> Schedule:
        """Placer ``k``'s schedule of ``g`` (``DoesNotFit`` each time when it does not)."""
        p = self.compile(g)
        return self._get(("place", k.name, id(g)), lambda: k.place(p, g), (g,))

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
        return self._get(("replay", id(p), id(s)), lambda: replay_schedule(p, s), (p, s))

    def replay_fifo(self, p: Problem, s: Schedule) -> tuple[float, float]:
        """``replay`` of ``s``'s placement with no order enforced (first come, first
        served)."""
        return self._get(("fifo", id(p), id(s)), lambda: _replay_fifo(p, s), (p, s))

    def layout(self, layout: str) -> Start:
        """The data-parallel starting graph of ``layout`` over the devices; ``NoBatch`` or
        ``DoesNotFit`` (every time) when there is none."""
        D = len(self.devices)
        replicas = self._get(("replicas",), lambda: data_parallel(self.graph, D))

        def build() -> Start:
            dp = data_parallel_fitting(self.graph, self.devices, layout == "data-parallel",
                                       self.bucket_bytes, replicas)
            if dp is None:
                raise DoesNotFit("data parallelism needs every replica (the model with its "
                                 f"share of the batch) to fit one device ({D} devices given)")
            return (dp, D, layout)
        return self._get(("layout", layout), build)

    def micro_batched(self) -> list[Start]:
        """The graph with its batch cut into m micro-batches, for each m of
        ``MICRO_BATCHES`` times the devices that the batch allows (none: ``NoBatch``), and
        beyond the data-parallel graph (m = the devices) of at most ``MICRO_OPS`` ops."""
        out: list[Start] = []
        for times in MICRO_BATCHES:
            m = times * len(self.devices)
            if times > 1 and m * len(self.graph) > MICRO_OPS:
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
                try:
                    starts.append(self.layout(layout))
                except (NoBatch, DoesNotFit):
                    pass
            if k.search:  # OS-DPOS also starts from the pipelines
                try:
                    starts += self.micro_batched()
                except NoBatch:
                    pass
        return starts + [(self.graph, 1, "model")]


@without_gc
def _plan(shared: Planning, k: StrategyKind, workers: int, forced: list[Split],
          split: bool = True) -> Strategy:
    t0 = time.perf_counter()
    shared.begin()
    starts = shared.starts(k, forced)
    if k.search:
        (best, replicas), runs = _searched(shared, starts, workers, split)
    else:
        def place(start: Graph, reps: int) -> tuple[Plan, int]:
            return Plan(start, shared.compile(start), shared.place(k, start)), reps
        # of the starting points that fit, the fastest plan (DPOS: never worse than any)
        cands = _feasible([functools.partial(place, g0, r) for g0, r, _ in starts])
        best, replicas = min(cands, key=lambda cand: cand[0].makespan)
        runs = len(cands) if k.name == "dpos" else 0
    g, p, s, splits = best.graph, best.problem, best.schedule, best.splits
    times, ordered = shared.replay(p, s), True
    if k.search:  # OS-DPOS keeps its order only where the simulator says it pays
        fifo = shared.replay_fifo(p, s)
        if fifo[::-1] < times[::-1]:
            times, ordered = fifo, False
    names = [d.name for d in shared.devices]
    placement = {p.names[i]: names[s.device[i]] for i in range(p.n)}
    order = [p.names[i] for i in s.order()]
    weights = prioritize(g, p, s.device, s.order(), ordered, shared.compile_graph, times,
                         shared.transfer_priorities)
    if weights is not None and weights.kept:
        g, placement, order, times = weights.graph, weights.placement, weights.order, \
            weights.times
    predicted, simulated = (t + step_overhead(shared.costs) for t in times)
    plan_time = shared.alone_s(time.perf_counter() - t0)
    return Strategy(name=k.name, devices=names, graph=g, placement=placement, order=order,
                    predicted_step_time_s=predicted, simulated_step_time_s=simulated,
                    plan_time_s=plan_time, splits=forced + splits, replicas=replicas,
                    dpos_runs=runs, note=s.note, ordered=ordered,
                    transfer_priorities=weights.summary() if weights else None)


def _searched(shared: Planning, starts: list[Start], workers: int,
              split: bool) -> tuple[tuple[Plan, int], int]:
    """OS-DPOS: from each starting graph, DPOS and every other placer that starts there (the
    data-parallel layout on the data-parallel graph; one device, HEFT, m-TOPO, m-ETF and m-SCT
    on the model graph; PipeDream alone on the micro-batched graphs); the split search from
    the fastest of these, then of all of them the plan that runs fastest when links carry
    one transfer at a time (so OS-DPOS is never simulated slower than any strategy of the
    registry); and DPOS runs made."""
    def start_from(g0: Graph, reps: int, layout: str) -> list[tuple[Plan, int]]:
        p0 = shared.compile(g0)
        kinds = [KINDS["dpos"]] * (layout != MICRO_BATCHED) + [
            k for k in KINDS.values() if k.starts == layout and k.starts_search]
        plans = _feasible([functools.partial(shared.place, k, g0) for k in kinds])
        return [(Plan(g0, p0, s0), reps) for s0 in plans]

    plans = [c for cs in _feasible([functools.partial(start_from, *start)
                                    for start in starts]) for c in cs]
    start_plan, reps = min(plans, key=lambda pr: pr[0].makespan)
    result = (os_dpos(start_plan.graph, shared.compile_graph, len(shared.devices),
                      start=start_plan, workers=workers) if split else start_plan)
    # Links carry one transfer at a time in truth, which DPOS's model ignores: of what was
    # planned, keep what runs fastest when they do (e.g. one device over a spread whose
    # transfers would queue).
    final, reps = min([(result, reps)] + plans, key=lambda pr: shared.replay(
        pr[0].problem, pr[0].schedule)[::-1])
    return (final, reps), result.tried + len(starts)


def replay(strategy: Strategy, devices: Sequence[Device], costs: CostSource, original: Graph,
           copy_bytes_per_s: float = 10e9, link_concurrency: int | None = None,
           fifo: bool = False) -> tuple[Problem, SimResult]:
    """``strategy``'s graph compiled under ``costs`` and its placement and per-device order
    replayed by the simulator (contention-free links by default): when each op and each
    transfer would run. With ``fifo`` the order is not enforced: each device runs its ready
    ops first come, first served, as TensorFlow's own executor does."""
    p = compiler(list(devices), costs, original, copy_bytes_per_s)(strategy.graph)
    index = {d.name: k for k, d in enumerate(devices)}
    device = [index[strategy.placement[n]] for n in p.names]
    if fifo:
        return p, simulate_fifo(p, device, link_concurrency)
    pos = {n: i for i, n in enumerate(p.names)}
    orders: list[list[int]] = [[] for _ in devices]
    for name in strategy.order:
        orders[device[pos[name]]].append(pos[name])
    return p, simulate(p, device, orders, link_concurrency=link_concurrency)


def predict(strategy: Strategy, devices: Sequence[Device], costs: CostSource,
            original: Graph, copy_bytes_per_s: float = 10e9, fifo: bool = False,
            link_concurrency: int | None = None) -> float:
    """``strategy``'s step time under ``costs`` (e.g. cost models updated since it was
    planned): its placement and order (with ``fifo``, TensorFlow's own first-come order)
    replayed (contention-free links unless ``link_concurrency``), plus the step's
    overhead."""
    return replay(strategy, devices, costs, original, copy_bytes_per_s,
                  link_concurrency=link_concurrency, fifo=fifo)[1].makespan + step_overhead(costs)


def step_overhead(costs: CostSource) -> float:
    """What a step takes beyond its ops and transfers, when ``costs`` knows it (else 0)."""
    known = getattr(costs, "step_overhead", None)
    return float(known()) if known else 0.0
