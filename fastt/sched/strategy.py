"""Strategies: one entry point for every placer, and the strategy document they produce.

``plan(graph, devices, costs, name)`` returns a ``Strategy``: the graph it refers to (the
data-parallel graph and splits included), the split list, a device for every op, the execution
order, and the predicted step time. The strategies are those of ``fastt.sched.registry``.
``dpos`` and ``os-dpos`` run from the data-parallel graph when every replica fits its device
(FastT's choice: never worse than data parallelism) and from the model graph, and keep the
faster plan (so never worse than DPOS on the model either). OS-DPOS also starts from every
other list scheduler of the registry (the data-parallel layout; one device, HEFT, m-TOPO, m-ETF
and m-SCT on the model graph; PipeDream on the graph cut into micro-batches; not the exact
program, a strategy of its own with a time limit) and from the data-parallel layouts with
weights kept whole where that pays (``fastt.passes.hybrid``), splits from the fastest starting
plan,
and of its starting plans and its split plan returns the one fastest when links carry one
transfer at a time: so it is never simulated slower than any of them, by construction
(``dpos`` stays pure DPOS). ``heft``, ``m-topo``, ``m-etf``, ``m-sct``, ``exact`` and
``single`` place the model graph, as their papers do;
``data-parallel`` puts replica k on device k and the shared ops (updates, whole-batch ops) on
device 0; ``pipedream`` cuts the batch into 1, 2 and 4 micro-batches per device and keeps
the fastest of its pipelines (``fastt.sched.placers.pipedream``).

Every strategy's step time is predicted the same way: its placement and per-device order
replayed by the simulator with contention-free links (``predicted_step_time_s``, the model
DPOS optimises) and with one transfer at a time per link direction
(``simulated_step_time_s``).

Strategies planned for the same graph, devices and costs share a ``Planning``
(``fastt.sched.search.planning``): the data-parallel and micro-batched graphs, compiled problems,
placements and replays are built once for all.
"""
from __future__ import annotations

import functools
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from fastt.costs.source import CostSource, knows_step_overhead
from fastt.errors import FasttError, NoBatch
from fastt.ir import Graph
from fastt.sched.placers._gc import without_gc
from fastt.passes.allreduce import BUCKET_BYTES
from fastt.passes.hybrid import kept_whole
from fastt.sched.search.osdpos import BUDGET_S, Plan, compiler, os_dpos
from fastt.sched.sim.problem import Device, Problem
from fastt.sched.registry import DEFAULT, KINDS, StrategyKind, kind
from fastt.sched.sim.schedule import Schedule
from fastt.sched.sim.simulate import SimResult, simulate, simulate_fifo
from fastt.passes.splitting import Split
from fastt.sched.search.planning import SPLIT_SHARE, Planning, feasible
from fastt.sched.search.step_fitting import micro_batches_of, recomputed_ops
from fastt.sched.search.starts import (MICRO_BATCHED, Start, graph_weights, micro_batched,
                                micro_batched_plans, replica_jobs, starts)
from fastt.sched.placers.transfer_order import Prioritized

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
    # its weight transfers ordered by need (``fastt.sched.placers.transfer_order``): what was found
    # and whether it was kept (None: no link carries two groups of weights, or switched off)
    transfer_priorities: dict[str, Any] | None = None
    # the weights of a data-parallel plan that run unreplicated (``fastt.passes.hybrid``)
    kept_whole: list[str] = field(default_factory=list)
    # so that the plan fits its devices: forward ops computed again in the backward pass,
    # and the micro-batches each replica runs in turn, gradients summed (1: none)
    recomputed: int = 0
    micro_batches: int = 1

    def key(self) -> str:
        """What makes two strategies one plan (``plan_key``)."""
        return plan_key(self.placement, self.splits, self.replicas)

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
                "transfer_priorities": self.transfer_priorities, "kept_whole": self.kept_whole,
                "recomputed_ops": self.recomputed,
                "micro_batches": self.micro_batches, "note": self.note}


def plan_key(placement: dict[str, str], splits: Sequence[Split], replicas: int) -> str:
    """What makes two plans one: the same placement, splits and replicas (not the order, nor
    the predictions)."""
    doc = json.dumps([sorted(placement.items()), [(x.op, x.dim, x.n) for x in splits],
                      replicas])
    return hashlib.sha1(doc.encode()).hexdigest()[:12]


def plan(graph: Graph, devices: Sequence[Device], costs: CostSource,
         name: str = DEFAULT, copy_bytes_per_s: float = 10e9, workers: int = 1,
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
    simulator predicts it faster, "on" always, "off" never (``fastt.sched.placers.transfer_order``).
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


@without_gc
def _plan(shared: Planning, k: StrategyKind, workers: int, forced: list[Split],
          split: bool = True) -> Strategy:
    t0 = time.perf_counter()
    shared.begin()
    if k.search:
        near, runs = _searched(shared, starts(shared, k, forced), workers, split, forced)
    else:
        cands = placed(shared, k, forced)
        near = [fastest(cands)]
        runs = len(cands) if k.name == "dpos" else 0
    # as each will run: OS-DPOS's order kept only where the simulator says it pays, the
    # weight transfers ordered where they pay; the fastest
    finished = [(fin, pl, reps) for fin, (pl, reps) in
                zip(_finish_each(shared, [pl for pl, _ in near], k.search), near)]
    # each with what its step takes beyond its replay: its own where it was profiled, else
    # what a step on one device takes (CostModels.step_overhead)
    fin, best, replicas = min(finished, key=lambda f: [
        t + _overhead(shared.costs, f[0].placement, forced + f[1].splits, f[2])
        for t in f[0].times[::-1]])
    plan_time = shared.alone_s(time.perf_counter() - t0)
    s = Strategy(name=k.name, devices=[d.name for d in shared.devices], graph=fin.graph,
                 placement=fin.placement, order=fin.order, predicted_step_time_s=0.0,
                 simulated_step_time_s=0.0, plan_time_s=plan_time,
                 splits=forced + best.splits, replicas=replicas, dpos_runs=runs,
                 note=best.schedule.note, ordered=fin.ordered,
                 transfer_priorities=fin.weights.summary() if fin.weights else None,
                 kept_whole=kept_whole(shared.graph, best.graph, graph_weights(shared))
                 if replicas > 1 else [], recomputed=recomputed_ops(fin.graph, shared.graph),
                 micro_batches=micro_batches_of(fin.graph, replicas))
    extra = _overhead(shared.costs, fin.placement, s.splits, replicas)
    s.predicted_step_time_s, s.simulated_step_time_s = (t + extra for t in fin.times)
    return s


def placed(shared: Planning, k: StrategyKind, forced: Sequence[Split] = ()
           ) -> list[tuple[Plan, int]]:
    """Strategy ``k`` (no search) placed from each of its starting points that fits, each
    plan replayed (``DoesNotFit`` when none fits): what its finish starts from, built once
    in ``shared``."""
    def place(start: Graph, reps: int) -> tuple[Plan, int]:
        pl = Plan(start, shared.compile(start), shared.place(k, start))
        shared.replay(pl.problem, pl.schedule)
        return pl, reps
    return feasible([functools.partial(place, g0, r)
                     for g0, r, _ in starts(shared, k, list(forced))])


def fastest(cands: Sequence[tuple[Plan, int]]) -> tuple[Plan, int]:
    """Of the starting points that fit, the fastest plan (DPOS: never worse than any)."""
    return min(cands, key=lambda cand: cand[0].makespan)


def place_first(shared: Planning, kinds: Sequence[StrategyKind]) -> None:
    """Each of ``kinds`` placed and replayed (``placed``; a misfit kept, to be said by its
    own planning), then finished (``_finish``) fastest first: under a deadline, the time
    left for ordering weight transfers goes to the plans likeliest to win. The placers of
    the model graph, of the micro-batched graphs and of TF-slim's layout where it starts from
    the replicas run on a second core (``Planning.place_aside``) while this one builds the
    all-reduce layout."""
    aside = [k for k in kinds if k.starts in ("model", "both", MICRO_BATCHED)]
    jobs = [(k, shared.graph) for k in aside if k.starts != MICRO_BATCHED]
    if any(k.starts == MICRO_BATCHED for k in aside):
        try:
            jobs += [(k, g) for g, _, _ in micro_batched(shared) for k in aside
                     if k.starts == MICRO_BATCHED]
        except NoBatch:
            pass
    replicas = replica_jobs(shared, kinds)  # TF-slim's layout placed there too
    jobs += replicas
    aside += [k for k, _ in replicas if k not in aside]

    def each(ks: Sequence[StrategyKind]) -> list[Plan]:
        out = []
        for k in ks:
            try:
                out.append(fastest(placed(shared, k))[0])
            except FasttError:
                pass  # its own planning says why
        return out

    join = shared.place_aside(jobs)
    each([k for k in kinds if k not in aside])  # the data-parallel layouts, meanwhile
    join()
    _finish_each(shared, sorted(each(kinds), key=lambda pl: shared.replay(
        pl.problem, pl.schedule)[::-1]), False)


def _finish_each(shared: Planning, plans: Sequence[Plan], choose_order: bool
                 ) -> list[_Final]:
    """Each of ``plans`` finished (``_finish``), in turn. A finish is expected to take about
    what compiling its graph takes (the largest plans' ordered transfers are several
    seconds), at least what the longest so far took."""
    out, longest = [], 0.0
    for pl in plans:
        t = time.perf_counter()
        out.append(_finish(shared, pl, choose_order, max(longest, shared.finish_s(pl.problem))))
        longest = max(longest, time.perf_counter() - t)
    return out


@dataclass
class _Final:
    """A plan as it will run."""
    graph: Graph
    placement: dict[str, str]
    order: list[str]
    times: tuple[float, float]  # replayed with free links, with one transfer at a time
    ordered: bool
    weights: Prioritized | None


def _finish(shared: Planning, plan: Plan, choose_order: bool,
            expected_s: float = 0.0) -> _Final:
    """``plan`` in its order or (``choose_order``, where the simulator says it runs faster)
    TensorFlow's, its weight transfers ordered by need where that pays
    (``shared.transfer_priorities``). When a finish expected to take ``expected_s`` would
    end past the deadline, only what is known already is used: no replay (of TensorFlow's
    order) or ordering is begun for it. Under a deadline the transfers of a plan that cannot
    beat the fastest replayed so far are left unordered (``Planning.may_win``)."""
    g, p, s = plan.graph, plan.problem, plan.schedule
    times, ordered = shared.replay(p, s), True
    late = shared.late(expected_s)
    if choose_order and not (late and not shared.replayed_fifo(p, s)):
        fifo = shared.replay_fifo(p, s)
        if fifo[::-1] < times[::-1]:
            times, ordered = fifo, False
    known = shared.was_prioritized(p, s, ordered)
    weights = None if not known and (late or not shared.may_win(times)) else \
        shared.prioritized(g, p, s, ordered, times)
    if weights is not None and weights.kept:
        return _Final(weights.graph, weights.placement, weights.order, weights.times,
                      ordered, weights)
    return _Final(g, _placement(shared, p, s), [p.names[i] for i in s.order()], times,
                  ordered, weights)


NEAR = 1.10  # OS-DPOS finishes (order, transfer priorities) the plans this close to its best
# (contention-free, against its best contended): ordering the weight transfers of VGG-19's
# pipeline over 16 micro-batches on 8 V100s took it from 80.0 ms free (88.4 contended) to 70.5


def _overhead(costs: CostSource, placement: dict[str, str], splits: Sequence[Split],
              replicas: int) -> float:
    """What a step of this plan takes beyond its replay under ``costs``: its own where it
    was profiled (``CostModels.step_overhead``)."""
    if not knows_step_overhead(costs):
        return 0.0  # nor the key's cost (a large graph's placement)
    return float(costs.step_overhead(len(set(placement.values())),
                                     plan_key(placement, splits, replicas)))


def _placement(shared: Planning, p: Problem, s: Schedule) -> dict[str, str]:
    """Op -> device name of schedule ``s`` of ``p``."""
    names = [d.name for d in shared.devices]
    return {p.names[i]: names[s.device[i]] for i in range(p.n)}


def _searched(shared: Planning, points: list[Start], workers: int, split: bool,
              forced: Sequence[Split] = ()) -> tuple[list[tuple[Plan, int]], int]:
    """OS-DPOS: from each starting graph, DPOS and every other placer that starts there (the
    data-parallel layout on the data-parallel graph; one device, HEFT, m-TOPO, m-ETF and m-SCT
    on the model graph; PipeDream alone on the micro-batched graphs); the split search from
    the fastest of these, then of all of them the plan that runs fastest when links carry
    one transfer at a time (so OS-DPOS is never simulated slower than any strategy of the
    registry): those that may come within ``NEAR`` of the fastest once finished, fastest
    first; and DPOS runs made."""
    def start_from(g0: Graph, reps: int, layout: str) -> list[tuple[Plan, int]]:
        p0 = shared.compile(g0)
        kinds = [KINDS["dpos"]] * (layout != MICRO_BATCHED) + [
            k for k in KINDS.values() if k.starts == layout and k.starts_search]
        plans = feasible([functools.partial(shared.place, k, g0) for k in kinds])
        return [(Plan(g0, p0, s0), reps) for s0 in plans]

    plans = [c for cs in feasible([functools.partial(start_from, *start)
                                    for start in points]) for c in cs]
    model = [pr for pr in plans if pr[1] == 1 and pr[0].graph is points[-1][0]]
    if model and any(layout == MICRO_BATCHED for *_, layout in points):
        plans += micro_batched_plans(shared, min(model, key=lambda pr: pr[0].makespan)[0])
    start_plan, reps = min(plans, key=lambda pr: pr[0].makespan)
    result = (os_dpos(start_plan.graph, shared.compile_graph, len(shared.devices),
                      start=start_plan, workers=workers,
                      budget_s=shared.budget(BUDGET_S, SPLIT_SHARE),
                      candidate_s=shared.candidate_s(start_plan.graph)) if split else start_plan)
    # Links carry one transfer at a time in truth, which DPOS's model ignores: of what was
    # planned, keep what runs fastest when they do (e.g. one device over a spread whose
    # transfers would queue).
    # A plan profiled already is judged with what its steps took beyond its replay (its
    # placement built only where the costs know such a thing).
    keyed = bool(getattr(shared.costs, "step_overhead", None))
    times: dict[int, tuple[float, float]] = {}
    for pl, r in [(result, reps)] + plans:
        p, s = pl.problem, pl.schedule
        extra = _overhead(shared.costs, _placement(shared, p, s), [*forced, *pl.splits],
                          r) if keyed else 0.0
        free, contended = shared.replay(p, s)
        times[id(pl)] = (free + extra, contended + extra)
    ranked = sorted([(result, reps)] + plans, key=lambda pr: times[id(pr[0])][::-1])
    best = times[id(ranked[0][0])][1]
    # finishing may take back what contention costs (weight transfers by need), never what
    # free links cost: a plan whose contention-free replay is near the best is finished too
    near = [pr for pr in ranked if times[id(pr[0])][0] <= NEAR * best]
    return near, result.tried + len(points)


def replay(strategy: Strategy, devices: Sequence[Device], costs: CostSource, original: Graph,
           copy_bytes_per_s: float = 10e9, link_concurrency: int | None = None,
           fifo: bool = False, adjust: Callable[[Problem], None] | None = None
           ) -> tuple[Problem, SimResult]:
    """``strategy``'s graph compiled under ``costs`` and its placement and per-device order
    replayed by the simulator (contention-free links by default): when each op and each
    transfer would run. With ``fifo`` the order is not enforced: each device runs its ready
    ops first come, first served, as TensorFlow's own executor does. ``adjust``: a change
    made to the compiled problem before it is replayed (a benchmark's emulation of a setup
    the graph does not express)."""
    p = compiler(list(devices), costs, original, copy_bytes_per_s)(strategy.graph)
    if adjust is not None:
        adjust(p)
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
    overhead (its own where it was profiled, ``CostModels.step_overhead``)."""
    return replay(strategy, devices, costs, original, copy_bytes_per_s,
                  link_concurrency=link_concurrency, fifo=fifo)[1].makespan + \
        _overhead(costs, strategy.placement, strategy.splits, strategy.replicas)
