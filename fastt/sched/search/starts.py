"""Where a strategy starts (``starts``): the model graph, the two data-parallel layouts (fitted
into the devices' memory where their replicas do not fit, ``fitted_layouts``), the
hybrid plans (weights kept whole), the micro-batched graphs of the pipelines; each built once
in the strategies' ``Planning``.
"""
from __future__ import annotations

import logging
from typing import Sequence

from fastt.errors import Declined, DoesNotFit, FasttError, NoBatch
from fastt.ir import Graph
from fastt.passes.data_parallel import data_parallel
from fastt.sched.search.memory_fit import data_parallel_fitting, data_parallel_peaks
from fastt.passes.hybrid import BUDGET_S as hybrid_budget_s
from fastt.passes.hybrid import Weight, keep_whole, promising, weights
from fastt.sched.search.osdpos import Plan, clock
from fastt.sched.placers.pipedream import micro_batch
from fastt.sched.search.planning import Planning
from fastt.sched.search.fitted_layouts import fitted_layout, over
from fastt.sched.registry import KINDS, StrategyKind
from fastt.passes.splitting import Split, apply_splits

log = logging.getLogger("fastt")

Start = tuple[Graph, int, str]  # (graph, replicas, layout: "model" or a data-parallel one)
LAYOUTS = ("data-parallel", "data-parallel-ps")
MICRO_BATCHED = "micro-batched"  # the batch cut into micro-batches (pipelines)
MICRO_BATCHES = (1, 2, 4)  # per device: the micro-batch counts a pipeline is tried with
MICRO_OPS = 150_000  # the largest micro-batched graph built beyond the data-parallel one
HYBRID_SHARE = 1 / 3  # of what is left before a deadline: the most the hybrid search takes
# Under a deadline a micro-batched graph of k times the devices is built only where a share
# of what is left pays about MICRO_COST * k times what the replicas took to build (it is then
# compiled, placed by PipeDream's cuts and replayed: RNNLM over 2x8 V100s, 32 micro-batches,
# 17.5 s where the replicas took 0.97 s)
MICRO_COST = 10.0


def starts(shared: Planning, k: StrategyKind, forced: list[Split]) -> list[Start]:
    """Where strategy ``k`` starts, the data-parallel graphs first."""
    if forced:  # a split list names the user's ops: it starts from the model graph
        if k.starts in LAYOUTS:
            raise FasttError("a split list cannot be combined with the data-parallel "
                             "strategy; plan it with dpos or os-dpos")
        return [(apply_splits(shared.graph, forced), 1, "model")]
    if k.starts in LAYOUTS:
        if len(shared.devices) < 2:
            raise Declined(f"{k.name} replicates the model on every device: it needs at "
                           f"least 2 devices ({len(shared.devices)} given)")
        return [layout(shared, k.starts)]
    if k.starts == MICRO_BATCHED:
        return micro_batched(shared)
    out: list[Start] = []
    if k.starts != "model" and len(shared.devices) > 1:
        for name in LAYOUTS:
            attempts = [layout] + [hybrid] * k.search
            for attempt in attempts:  # OS-DPOS also starts from the hybrid plans
                try:
                    out.append(attempt(shared, name))
                except (NoBatch, DoesNotFit, Declined):
                    pass
        if k.search and shared.pipelines:  # OS-DPOS also starts from the pipelines
            try:
                out += micro_batched(shared)
            except NoBatch:
                pass
    return out + [(shared.graph, 1, "model")]


def layout(shared: Planning, name: str) -> Start:
    """The data-parallel starting graph of layout ``name`` over the devices; ``NoBatch`` or
    ``DoesNotFit`` (every time) when there is none."""
    D = len(shared.devices)
    replicas = shared.replicas()

    def build() -> Start:
        dp, peaks = data_parallel_peaks(shared.graph, shared.devices, name == "data-parallel",
                                        shared.bucket_bytes, replicas, shared.compile)
        if over(peaks, shared.devices) > 0:  # accumulated or recomputed, where that fits
            dp = fitted_layout(shared, name, peaks)
        return (dp, D, name)
    return shared.cached(("layout", name), build)


def replica_jobs(shared: Planning, kinds: Sequence[StrategyKind]
                 ) -> list[tuple[StrategyKind, Graph]]:
    """The placements of those of ``kinds`` that start from TF-slim's layout (its own placer,
    DPOS) on the data-parallel replicas, where the layout is the replicas themselves (they
    fit the devices' memory): work for the second core (``Planning.place_aside``)."""
    ps = [k for k in kinds if k.starts in ("data-parallel-ps", "both")]
    if not ps or len(shared.devices) < 2:
        return []
    try:
        g = layout(shared, "data-parallel-ps")[0]
        if g is not shared.replicas():
            return []
    except (NoBatch, DoesNotFit, Declined):
        return []
    return [(k, g) for k in ps]


def hybrid(shared: Planning, name: str) -> Start:
    """Layout ``name``'s data-parallel start with the weights kept whole
    (``fastt.passes.hybrid``) that shorten its simulated step; ``Declined`` when none does."""
    D = len(shared.devices)

    def graph_of(whole: frozenset[str]) -> Graph | None:
        try:
            if not whole:
                return layout(shared, name)[0]
            return _fitting(shared, name, data_parallel(shared.graph, D, whole))
        except DoesNotFit:
            return None

    def step_time(g: Graph) -> float:
        k = KINDS[name]  # the layout's own placer: its schedule and replay shared
        return shared.replay(shared.compile(g), shared.place(k, g))[1]

    def build() -> Start:
        p0 = shared.compile(shared.graph)
        slowest = max(p0.slope[a][b] for a in range(D) for b in range(D) if a != b)
        cands = promising(graph_weights(shared), lambda w: sum(
            p0.w[p0.index[o]][0] for o in w.ops if o in p0.index), slowest, D)
        built = hybrid_candidate_s(shared, name)
        if shared.deadline is None:
            budget_s = hybrid_budget_s
        else:  # one share of what is left for both layouts' searches
            if shared.hybrid_ends is None:
                shared.hybrid_ends = clock() + shared.budget(hybrid_budget_s, HYBRID_SHARE)
            budget_s = max(0.0, shared.hybrid_ends - clock())
        if cands and built > budget_s:
            raise Declined(f"no time left to keep weights whole in {name} (a candidate "
                           f"takes about {built:.0f} s; {budget_s:.0f} s left for it)")
        g, kept = keep_whole(cands, graph_of, step_time, candidate_s=built,
                             budget_s=budget_s) if cands else (None, [])
        if g is None or not kept:
            raise Declined(f"no weight pays to keep whole in {name}")
        log.info("hybrid %s: %s kept whole", name, ", ".join(w.variable for w in kept))
        return (g, D, name)
    return shared.cached(("hybrid", name), build)


def hybrid_candidate_s(shared: Planning, name: str) -> float:
    """About what one candidate of the hybrid search of layout ``name`` takes: what its
    data-parallel start took to build (the replicas, the layout), compile, place and
    replay, each piece once (the replicas of TF-slim's layout are compiled before it, the
    all-reduce graph while it is built)."""
    g = layout(shared, name)[0]
    return shared.built_s(("replicas",), ("layout", name), *shared.plan_keys(KINDS[name], g))


def _fitting(shared: Planning, name: str, replicas: Graph) -> Graph | None:
    """Layout ``name`` of ``replicas`` (a data-parallel graph of the devices) when every
    device holds its replica, else None
    (``fastt.sched.search.memory_fit.data_parallel_fitting``)."""
    return data_parallel_fitting(shared.graph, shared.devices, name == "data-parallel",
                                 shared.bucket_bytes, replicas, shared.compile)


def graph_weights(shared: Planning) -> list[Weight]:
    """The graph's weights (``fastt.passes.hybrid.weights``)."""
    return shared.cached(("weights",), lambda: weights(shared.graph))


def micro_batched(shared: Planning) -> list[Start]:
    """The graph with its batch cut into m micro-batches, for each m of ``MICRO_BATCHES``
    times the devices that the batch allows (none: ``NoBatch``), and beyond the data-parallel
    graph (m = the devices) of at most ``MICRO_OPS`` ops and, under a deadline, only where a
    share of what is left pays for it (``MICRO_COST``)."""
    out: list[Start] = []
    D = len(shared.devices)
    for times in MICRO_BATCHES:
        m = times * D
        if times > 1 and m * len(shared.graph) > MICRO_OPS:
            break
        if times > 1 and not shared.known(("micro", m)) and shared.deadline is not None:
            cost = MICRO_COST * times * shared.built_s(("replicas",))
            if cost > shared.budget(cost, HYBRID_SHARE):
                log.info("no time left for %d micro-batches (about %.0f s)", m, cost)
                break
        try:  # D micro-batches: the data-parallel replicas
            g = shared.replicas() if m == D else \
                shared.cached(("micro", m), lambda: data_parallel(shared.graph, m))
        except NoBatch:
            break
        out.append((g, m, MICRO_BATCHED))
    if not out:
        raise NoBatch(f"the batch cannot be cut into {D} micro-batches")
    return out


def micro_batched_plans(shared: Planning, plan: Plan) -> list[tuple[Plan, int]]:
    """``plan`` (of the model graph) over each micro-batched graph: every part of an op on
    the op's device (``fastt.sched.placers.pipedream.micro_batch``), and its micro-batches; where
    one would end past the deadline (it takes about what finishing a plan of its graph
    takes), only those placed already."""
    p0 = plan.problem
    placed = {p0.names[i]: plan.schedule.device[i] for i in range(p0.n)}
    out = []
    for g, m, _ in micro_batched(shared):
        key = ("micro-placed", id(plan.schedule), id(g))
        p = shared.compile(g)
        if shared.late(shared.finish_s(p)) and not shared.known(key):
            continue
        note = f"a placement of the model graph over {m} micro-batches"
        try:
            out.append((Plan(g, p, shared.cached(
                key, lambda: micro_batch(p, g, placed, note), (plan.schedule, g))), m))
        except DoesNotFit:
            pass
    return out
