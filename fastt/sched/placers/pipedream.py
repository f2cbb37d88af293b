"""PipeDream over fastt's op graphs: the layers of a training graph, its micro-batched graph
placed by stages, the ``pipedream`` placer of the registry (``fastt.sched.placers.stages`` holds the
partitioner).

A micro-batched graph is the data-parallel graph (``data_parallel(graph, m)``: micro-batch k
= the ops ``X/part{k}``, the batch cut by the same exact rules, the gradients of the
micro-batches summed before the one update, whole-batch ops run once behind a join), placed
so that all the parts of an op run in its stage: the update waits for every micro-batch, so a
step computes what the original does (GPipe's synchronous pipeline with a flush).
"""
from __future__ import annotations

import math
from typing import Mapping

from fastt.errors import DoesNotFit
from fastt.ir import Graph
from fastt.sched.placers.baselines import place_replicas, replica_layout
from fastt.passes.replicas import replica_of
from fastt.passes.recompute import gradient_of
from fastt.sched.placers.dpos import rank_u
from fastt.sched.placers.stages import Stage, balanced, partition
from fastt.sched.sim.problem import Problem
from fastt.sched.sim.schedule import Schedule
from fastt.sched.sim.simulate import simulate_fifo


LAYERS = 48  # the partitioner's layers: forward ops in topological order, about equal work


def layers(p: Problem, g: Graph, count: int = LAYERS) -> list[int]:
    """The layer (0..count-1) of each op of ``p`` (compiled from ``g``; a micro-batched
    graph's parts count as their op). A unit is a weight (its variable, reads and updates)
    with the forward ops that read it, and the forward ops it feeds that read no weight
    (else, for ops no weight feeds, the unit they feed): an unrolled recurrent layer, whose
    weight every time step reads, is one unit, never cut through time. Units, in the order
    the forward pass first reaches them, are cut into layers of about equal work, forward
    and backward: a gradient op goes with the forward op it was made for; what is left (the
    optimizer's own ops) with the ops it feeds, else the ops feeding it."""
    key = [g[n].meta.origin or n for n in p.names]
    back = [gradient_of(k) for k in key]
    after_back = [False] * p.n  # the backward pass and what follows it (the updates)
    for i in p.topo:
        after_back[i] = back[i] is not None or any(after_back[m] for m, _ in p.preds[i])
    forward = [i for i in p.topo if not after_back[i]]
    pos = {i: k for k, i in enumerate(forward)}
    weights = {p.group[i] for i in range(p.n) if g[p.names[i]].is_variable}
    unit: dict[int, int] = {}  # forward op -> its unit (a colocation group id, or an op)
    parent: dict[int, int] = {}

    def find(x: int) -> int:  # with path halving: the same roots, short chains
        up = parent.get(x, x)
        while up != x:
            grand = parent.get(up, up)
            parent[x] = grand
            x, up = up, grand
        return x

    for i in forward:  # a weight with the forward ops reading it
        if p.group[i] in weights:
            unit[i] = p.group[i]
        for m, _ in p.preds[i]:
            if p.group[m] in weights and m in pos:
                a, b = find(p.group[m]), find(unit.get(i, p.group[m]))
                parent[b] = a
                unit[i] = a
    for i in forward:  # then what the forward pass feeds from them
        if i not in unit:
            fed = [m for m, _ in p.preds[i] if m in unit]
            if fed:
                unit[i] = unit[max(fed, key=pos.__getitem__)]
    for i in reversed(forward):  # else the unit it feeds
        if i not in unit:
            feeds = [j for j, _ in p.succs[i] if j in unit]
            unit[i] = unit[min(feeds, key=pos.__getitem__)] if feeds else p.n + i
    root = {i: find(u) for i, u in unit.items()}
    first: dict[int, int] = {}
    for i in forward:
        first.setdefault(root[i], pos[i])
    order = {u: k for k, u in enumerate(sorted(first, key=first.__getitem__))}
    unit_of_key: dict[str, int] = {}
    for i in forward:
        unit_of_key.setdefault(key[i], order[root[i]])
    work = [max(row) for row in p.w]
    load = [0.0] * len(order)
    owner: list[int | None] = [None] * p.n  # each op's unit, by its place in ``order``
    for i in range(p.n):
        owner[i] = order[root[i]] if i in root else unit_of_key.get(back[i] or "")
        if owner[i] is not None:
            load[owner[i]] += work[i]  # type: ignore[index]
    total, layer_of_unit, done = sum(load) or 1.0, [], 0.0
    for x in load:  # a unit in the layer its middle falls in
        layer_of_unit.append(min(int((done + x / 2) / total * count), count - 1))
        done += x
    layer: list[int | None] = [None if u is None else layer_of_unit[u] for u in owner]
    of_weight = {p.group[m]: layer[m] for m in forward if p.group[m] in weights}
    for i in range(p.n):  # an update with its weight
        if layer[i] is None and p.group[i] in weights:
            layer[i] = of_weight.get(p.group[i])
    for i in reversed(p.topo):  # what is left: with the ops it feeds
        if layer[i] is None:
            after = [layer[j] for j, _ in p.succs[i] if layer[j] is not None]
            layer[i] = min(after) if after else None  # type: ignore[type-var]
    for i in p.topo:  # else with the ops feeding it
        if layer[i] is None:
            before = [layer[m] for m, _ in p.preds[i] if layer[m] is not None]
            layer[i] = max(before) if before else 0  # type: ignore[type-var]
    return [x or 0 for x in layer]


def pipedream(p: Problem, g: Graph) -> Schedule:
    """A pipeline of the micro-batched graph ``g``: its ``layers`` cut into stages by
    PipeDream's program (``partition``: stages and replication minimising the slowest stage
    in steady state) and, since a synchronous pipeline also pays to fill and drain, by the
    same program with the stage count fixed to each divisor S of the devices, D/S devices a
    stage (``balanced``); each placed by ``place_stages`` and run in two orders, GPipe's (the
    ops of each device by decreasing upward rank: every micro-batch's forward pass before the
    backward passes) and the earliest micro-batch first (its backward pass before the next
    forward passes, as 1F1B). Of these, the plan simulated fastest with one transfer at a
    time per link. O(C (n + e) log n) for C = 2 x (1 + the divisors) candidates."""
    D = p.num_devices
    layer = layers(p, g)
    T, a, w = _layer_costs(p, layer)
    B = _bandwidth(p)
    cuts = [partition(T, a, w, D, B)[1]]
    cuts += [balanced(T, a, w, S, D // S, B)[1] for S in range(1, min(D, len(T)) + 1)
             if D % S == 0]
    best: Schedule | None = None
    misfits: list[DoesNotFit] = []
    layout = replica_layout(p, g)  # the same for every candidate, as are the priorities
    priorities = _priorities(p, layout[0])
    for stages in dict.fromkeys(tuple(c) for c in cuts):
        try:
            s = fastest_order(p, g, place_stages(p, g, layer, list(stages), layout),
                              "stages: " + ", ".join(
                                  f"slices {st.first}-{st.last} on {st.replicas} device"
                                  f"{'s' * (st.replicas > 1)}" for st in stages) +
                              f" (of the forward pass cut in {len(T)} slices of equal work)",
                              beat=math.inf if best is None else best.makespan,
                              priorities=priorities)
        except DoesNotFit as e:
            misfits.append(e)
            continue
        if s is not None:
            best = s
    if best is None:
        raise misfits[0]
    return best


def _priorities(p: Problem, part: list[int | None]) -> tuple[list[float], list[float]]:
    """``fastest_order``'s two orders as priorities of the ops of ``p`` (``part``: each op's
    micro-batch, None for shared): GPipe's (the upward rank), and the earliest micro-batch
    first."""
    rank = rank_u(p)
    top = max(rank, default=0.0) + 1.0
    return rank, [rank[i] - top * (part[i] or 0) for i in range(p.n)]


def fastest_order(p: Problem, g: Graph, device: list[int], note: str,
                  beat: float = math.inf,
                  priorities: tuple[list[float], list[float]] | None = None
                  ) -> Schedule | None:
    """The micro-batched graph ``g`` placed on ``device`` run in GPipe's order (each device's
    ready ops by decreasing upward rank: every micro-batch's forward pass before the backward
    passes) and earliest micro-batch first (its backward pass before the next forward
    passes, as 1F1B), links carrying one bulk transfer at a time: the faster of those whose
    simulated peak of live tensors each device holds (``DoesNotFit`` when neither), its
    order added to ``note``; None when it is no faster than ``beat`` (the caller's best so
    far). A peak is worked out only where it can change the answer: it takes about what a
    replay takes. ``priorities``: ``_priorities`` of ``p``, when the caller has them."""
    gpipe, earliest = priorities or _priorities(p, [replica_of(g[n]) for n in p.names])
    bounded = any(c != math.inf for c in p.capacity)
    orders = [(order, simulate_fifo(p, device, link_concurrency=1, priority=priority))
              for order, priority in (("GPipe", gpipe), ("earliest micro-batch first",
                                                         earliest))]
    ends = [max(r.finish, default=0.0) for _, r in orders]  # each one's Schedule.makespan
    if min(ends) >= beat:
        return None  # whichever fits, the caller keeps its own
    best: Schedule | None = None
    misfit = ""
    for k, (order, r) in enumerate(orders):
        if best is not None and not r.makespan < best.makespan:
            continue
        if k == 0 and ends[0] >= beat and orders[1][1].makespan < ends[0]:
            continue  # it cannot be the answer, and the next order is weighed either way
        over = [(peak, cap, d) for d, (peak, cap) in enumerate(zip(r.peak_memory, p.capacity))
                if peak > cap] if bounded else []
        if over:
            peak, cap, d = over[0]
            misfit = misfit or (f"{note}, {order}: device {p.devices[d].name} would hold "
                                f"{peak / 2 ** 20:.1f} MiB, more than its {cap / 2 ** 20:.1f} MiB")
        else:
            best = Schedule(list(device), r.start, r.finish, note=f"{note}, {order}")
    if best is None:
        if beat < math.inf:
            return None
        raise DoesNotFit(misfit)
    return best if best.makespan < beat else None


def micro_batch(p: Problem, g: Graph, placed: Mapping[str, int], note: str) -> Schedule:
    """A placement of the model graph (``placed``: op -> device) over the micro-batched graph
    ``g`` (compiled as ``p``): every part of an op on its op's device, an op fastt made for the
    micro-batches (a cut of the batch, a join) with the op feeding it (``place_replicas``
    for the rest), in the faster of ``fastest_order``'s orders."""
    device = [0] * p.n
    for i in p.topo:
        name = p.names[i]
        home = placed.get(g[name].meta.origin or name)
        if home is None:
            home = next((device[m] for m, _ in p.preds[i]), 0)
        device[i] = home
    s = fastest_order(p, g, place_replicas(p, g, lambda i, k: device[i]), note)
    assert s is not None  # nothing to beat
    return s


def place_stages(p: Problem, g: Graph, layer: list[int], stages: list[Stage],
                 layout: tuple[list[int | None], list[int]] | None = None) -> list[int]:
    """The device of each op of ``g`` (compiled as ``p``, op i in ``layer[i]``): stage s on
    its own consecutive devices, micro-batch k of a stage on r replicas on its (k mod r)-th
    device, the ops the micro-batches share (the sums of their gradients, the updates,
    whole-batch ops) on the stage's first device (``place_replicas``; ``layout``: its
    ``replica_layout``, when the caller has it)."""
    first_device, stage_of = [], [0] * (max(layer, default=0) + 1)
    for s_index, st in enumerate(stages):
        first_device.append(sum(x.replicas for x in stages[:s_index]))
        for x in range(st.first, st.last + 1):
            stage_of[x] = s_index

    def where(i: int, part: int | None) -> int:
        st = stage_of[layer[i]]
        return first_device[st] + (part or 0) % stages[st].replicas
    return place_replicas(p, g, where, layout)


def _layer_costs(p: Problem, layer: list[int]
                 ) -> tuple[list[float], list[float], list[float]]:
    """Per layer: its compute (mean over the devices), the bytes crossing the cut after it
    (the larger direction), its weights' bytes."""
    L = max(layer, default=0) + 1
    T, w = [0.0] * L, [0.0] * L
    ahead, back = [0.0] * (L + 1), [0.0] * (L + 1)  # bytes crossing each cut, by direction
    for i in range(p.n):
        T[layer[i]] += sum(p.w[i]) / p.num_devices
        w[layer[i]] += p.persistent[i]
        for m, e in p.preds[i]:
            lo, hi = sorted((layer[m], layer[i]))
            flow = ahead if layer[m] < layer[i] else back
            flow[lo] += p.edge_bytes[e]
            flow[hi] -= p.edge_bytes[e]
    a, run_ahead, run_back = [], 0.0, 0.0
    for k in range(L):
        run_ahead += ahead[k]
        run_back += back[k]
        a.append(max(run_ahead, run_back))
    return T, a, w


def _bandwidth(p: Problem) -> float:
    """The slowest link's bytes per second."""
    D = p.num_devices
    slopes = [p.slope[x][y] for x in range(D) for y in range(D) if x != y]
    return 1.0 / max(max(slopes, default=0.0), 1e-15)
