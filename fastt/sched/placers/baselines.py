"""Baseline placers with DPOS's interface (``Problem -> Schedule``).

- ``single``: every op on the one device that runs the whole graph fastest (memory permitting).
- ``heft``: HEFT (Topcuoglu et al., TPDS 2002): ranks from *mean* costs, every op to its
  earliest-finish device, insertion-based. O((V + E) * D).
- ``m_topo``: Baechi's memory-constrained topological placer (Jeon et al., SoCC 2020): ops in
  topological order fill one device up to ``sum(mem) / D + max(mem)``, then the next.
- ``data_parallel``: each replica of the data-parallel graph on its own device, the shared
  ops on device 0 (TF-slim's layout).
- ``m_sct``: Baechi's m-SCT: m-ETF, each op's favourite child (Hanen and Munier's SCT linear
  relaxation, ``fastt.sched.placers.msct``) kept on its parent's device.
- ``m_etf``: Baechi's memory-constrained Earliest Task First: repeatedly schedule the (op, device)
  pair that can start earliest, if the device's memory holds the op. O(V * D * log V).

Ops are timed as a list schedule of each device's order, transfers contention-free (the
placers' own model); ``fastt.sched.sim.simulate`` replays any of them under link contention.
"""
from __future__ import annotations

import heapq
from typing import Callable, Iterable

from fastt.errors import DoesNotFit
from fastt.ir import Graph
from fastt.op_types import SHAPE_OPS
from fastt.passes.data_parallel import BATCH_SHAPE
from fastt.passes.replicas import replica_of
from fastt.sched.placers.dpos import eft_list_schedule, group_memory, rank_u
from fastt.sched.sim.problem import Problem
from fastt.sched.sim.rings import ring_order
from fastt.sched.sim.schedule import Schedule, ready_times
from fastt.passes.ring import SCOPE as RING
from fastt.sched.sim.simulate import simulate, simulate_fifo
from fastt.passes.splitting import PART_SHAPE


def timed(p: Problem, device: list[int], order: list[int]) -> Schedule:
    """Start and finish times of ``order`` run on ``device`` (contention-free transfers)."""
    orders: list[list[int]] = [[] for _ in range(p.num_devices)]
    for i in order:
        orders[device[i]].append(i)
    r = simulate(p, device, orders, link_concurrency=None)
    return Schedule(list(device), r.start, r.finish)


def single(p: Problem) -> Schedule:
    gmem = sum(p.mem)
    fits = [d for d in range(p.num_devices) if gmem <= p.devices[d].memory]
    if not fits:
        raise DoesNotFit("the graph does not fit in any single device's memory")
    best = min(fits, key=lambda d: (sum(row[d] for row in p.w), d))
    return timed(p, [best] * p.n, p.topo)


def heft(p: Problem) -> Schedule:
    D = p.num_devices
    wbar = [sum(r) / D for r in p.w]
    pairs = [(a, b) for a in range(D) for b in range(D) if a != b]
    if p.hinged():  # links that bend: the mean of the pairs' costs, edge by edge
        cbar = [sum(p.transfer(a, b, nbytes) for a, b in pairs) / len(pairs)
                for nbytes in p.edge_bytes]
    else:  # the mean of the pairs' lines intercept + slope * bytes is the line of their means
        mean_i = sum(p.intercept[a][b] for a, b in pairs) / len(pairs) if pairs else 0.0
        mean_s = sum(p.slope[a][b] for a, b in pairs) / len(pairs) if pairs else 0.0
        cbar = [mean_i + mean_s * nbytes for nbytes in p.edge_bytes]
    rank = [0.0] * p.n
    for i in reversed(p.topo):
        rank[i] = wbar[i] + max((cbar[e] + rank[j] for j, e in p.succs[i]), default=0.0)
    pos = {op: k for k, op in enumerate(p.topo)}
    return _eft_list_schedule(p, sorted(range(p.n), key=lambda i: (-rank[i], pos[i])))


def _eft_list_schedule(p: Problem, visit: list[int]) -> Schedule:
    """Each op, in ``visit`` order, to the device where it finishes first (as in DPOS)."""
    device, start, finish = eft_list_schedule(p, visit, group_memory(p), [0.0] * p.num_devices,
                                              {})
    return Schedule(device, start, finish)


def m_topo(p: Problem) -> Schedule:
    D = p.num_devices
    gmem = group_memory(p)
    limit = sum(p.mem) / D + max(p.mem, default=0.0)
    caps = [min(limit, dev.memory) for dev in p.devices]
    device = [-1] * p.n
    group_dev: dict[int, int] = {}
    used = [0.0] * D
    d = 0
    for i in p.topo:
        g = p.group[i]
        if g not in group_dev:
            while d < D and used[d] + gmem[g] > caps[d]:
                d += 1
            if d == D:  # Baechi's balanced limit is a target; fall back to real capacity
                fits = [k for k in range(D) if used[k] + gmem[g] <= p.devices[k].memory]
                if not fits:
                    raise DoesNotFit(f"op {p.names[i]!r} fits in no device's remaining memory")
                d = fits[0]
            group_dev[g] = d
            used[d] += gmem[g]
        device[i] = group_dev[g]
    return timed(p, device, p.topo)


def m_etf(p: Problem) -> Schedule:
    return _etf(p, {})


def m_sct(p: Problem) -> Schedule:
    """Baechi's m-SCT: m-ETF, each favourite child (SCT's linear relaxation,
    ``fastt.sched.placers.msct``) on its parent's device while that device's memory holds it."""
    from fastt.sched.placers.msct import favourite_children  # SciPy: imported when m-SCT runs
    return _etf(p, favourite_children(p))


def _etf(p: Problem, favourite: dict[int, int]) -> Schedule:
    D = p.num_devices
    gmem = group_memory(p)
    used = [0.0] * D
    group_dev: dict[int, int] = {}
    device, start, finish = [-1] * p.n, [0.0] * p.n, [0.0] * p.n
    free = [0.0] * D
    missing = [len(p.preds[i]) for i in range(p.n)]
    heaps: list[list[tuple[float, int]]] = [[] for _ in range(D)]  # (data-ready time, op)
    placed = [False] * p.n
    parent = {child: i for i, child in favourite.items()}

    followers: set[int] = set()  # favourite children queued on their parent's device only

    def release(i: int, follow: bool = True) -> None:
        ready = ready_times(p, i, device, finish)
        g = p.group[i]
        if g in group_dev:
            devices: Iterable[int] = [group_dev[g]]
        elif follow and i in parent:
            devices = [device[parent[i]]]  # a favourite child follows its parent
            followers.add(i)
        else:
            devices = range(D)
        for d in devices:
            heapq.heappush(heaps[d], (ready[d], i))

    for i in range(p.n):
        if missing[i] == 0:
            release(i)
    left = p.n
    while left:
        best = None  # (earliest start, data-ready, device, op)
        spilled = []  # favourite children whose parent's device is full: queued anywhere
        for d in range(D):
            h = heaps[d]
            while h and (placed[h[0][1]] or _blocked(p, h[0][1], d, used, gmem, group_dev)):
                _, i = heapq.heappop(h)
                if i in followers and not placed[i]:
                    followers.discard(i)
                    spilled.append(i)
            if h:
                cand = (max(free[d], h[0][0]), h[0][0], d, h[0][1])
                if best is None or cand < best:
                    best = cand
        for i in spilled:
            release(i, follow=False)
        if spilled:
            continue  # the heaps changed under the scan
        if best is None:
            stuck = next(p.names[i] for i in range(p.n) if not placed[i])
            raise DoesNotFit(f"op {stuck!r} fits in no device's remaining memory")
        left -= 1
        st, _, d, i = best
        heapq.heappop(heaps[d])
        g = p.group[i]
        if g not in group_dev:
            group_dev[g] = d
            used[d] += gmem[g]
        placed[i] = True
        device[i], start[i], finish[i] = d, st, st + p.w[i][d]
        free[d] = finish[i]
        for j, _ in p.succs[i]:
            missing[j] -= 1
            if missing[j] == 0:
                release(j)
    return Schedule(device, start, finish)


def _blocked(p: Problem, i: int, d: int, used: list[float], gmem: dict[int, float],
             group_dev: dict[int, int]) -> bool:
    g = p.group[i]
    if g in group_dev:
        return group_dev[g] != d
    return used[d] + gmem[g] > p.devices[d].memory


SHAPE_READERS = SHAPE_OPS | {BATCH_SHAPE, PART_SHAPE}


def replica_layout(p: Problem, g: Graph) -> tuple[list[int | None], list[int]]:
    """Per op of the data-parallel (or micro-batched) graph ``g`` compiled as ``p``: its
    replica (None: shared by the replicas), and the op whose device it takes (an op reading a
    shared tensor's shape: the tensor's producer; -1: none). What ``place_replicas`` reads,
    found once for the placements of one graph."""
    part: list[int | None] = [None] * p.n
    follows = [-1] * p.n
    index = p.index
    for i, name in enumerate(p.names):
        op = g[name]
        k = part[i] = replica_of(op)
        if k is None and op.type in SHAPE_READERS and op.inputs and op.inputs[0].op in index:
            follows[i] = index[op.inputs[0].op]  # a shape is read where its tensor is
    return part, follows


def place_replicas(p: Problem, g: Graph, where: Callable[[int, int | None], int],
                   layout: tuple[list[int | None], list[int]] | None = None) -> list[int]:
    """The device of each op of the data-parallel (or micro-batched) graph ``g``:
    ``where(i, k)`` for op i of replica k (None: shared by the replicas), but an op reading
    a shared tensor's shape goes where that tensor is, and a colocation group with its first
    member. ``layout``: ``replica_layout(p, g)``, when the caller has it."""
    part, follows = layout or replica_layout(p, g)
    device = [0] * p.n
    for i in p.topo:
        f = follows[i]
        device[i] = device[f] if f >= 0 else where(i, part[i])
    groups: dict[int, int] = {}
    for i, grp in enumerate(p.group):  # colocation wins: a group follows its first member
        device[i] = groups.setdefault(grp, device[i])
    return device


def replica_devices(p: Problem, g: Graph) -> list[int]:
    """The device of each op of the data-parallel graph ``g``: replica k on the k-th device
    of ``ring_order`` (mod D), the ops shared by the replicas (updates, whole-batch ops) on
    device 0 (the ops reading a tensor's shape next to it), colocation groups with their
    first member."""
    D = p.num_devices
    ring = ring_order(p.slope)
    return place_replicas(p, g, lambda i, k: 0 if k is None else ring[k % D])


def data_parallel(p: Problem, g: Graph) -> Schedule:
    """The data-parallel graph ``g``'s ops on their ``replica_devices``. Each device runs its
    ready ops by decreasing upward rank, the all-reduce's ops first (as soon as a bucket's
    gradients are there: the ring overlaps the backward pass, as Horovod's and NCCL's streams
    do), links carrying one bulk transfer at a time."""
    device = replica_devices(p, g)
    rank = rank_u(p)
    top = max(rank, default=0.0) + 1.0
    priority = [rank[i] + (top if (g[name].meta.split_of or "").startswith(RING) else 0.0)
                for i, name in enumerate(p.names)]
    r = simulate_fifo(p, device, link_concurrency=1, priority=priority)
    return Schedule(device, r.start, r.finish)
