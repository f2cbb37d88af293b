"""DPOS: Device Placement and Operation Sequencing (FastT, Middleware 2020, Algorithm 1).

List scheduling in two phases. Prioritisation: ``rank_u(i) = w_i + max_j (c_ij + rank_u(j))``
with ``w_i`` the *largest* compute time of op i over the devices and ``c_ij`` the largest
transfer time of edge i->j over device pairs. Selection: ops are visited by decreasing rank;
critical-path ops go to the critical-path device (the device with the smallest average time for
as many remaining critical-path ops as its memory holds), every other op to the device with the
earliest finish time, found insertion-based (the earliest idle gap that fits). A device whose
memory the op's colocation group would exceed has EFT = +inf.

Guarantee (the paper's Theorem 1): ``omega_DPOS <= 2 * omega_opt + C_max``.

Complexity: O((V + E) * D) for ranks and ready times, plus the gap searches (amortised small).
"""
from __future__ import annotations

import math

from fastt.errors import DoesNotFit
from fastt.sched.placers._gc import without_gc
from fastt.sched.sim._native import simcore
from fastt.sched.sim.problem import Problem
from fastt.sched.sim.schedule import Schedule, Timeline, ready_times


def rank_u(p: Problem, c: list[float] | None = None, compiled: bool = True) -> list[float]:
    """Upward rank of every op, with max-over-devices compute and transfer costs. Runs
    compiled (``_simcore``) where it was built and ``compiled``; the same ranks."""
    c = p.max_comm() if c is None else c
    if simcore is not None and compiled:
        return simcore.rank_u(p.topo, p.succs, c, [max(r) for r in p.w])
    rank = [0.0] * p.n
    for i in reversed(p.topo):
        best = 0.0
        for j, e in p.succs[i]:
            v = c[e] + rank[j]
            if v > best:
                best = v
        rank[i] = max(p.w[i]) + best
    return rank


def critical_path(p: Problem, rank: list[float], c: list[float] | None = None) -> list[int]:
    """SET_CP: from the entry op of largest rank, follow the successor on which each rank is
    attained (largest ``c_ij + rank_u(j)``; the paper's 'largest rank' when transfers are free)."""
    if p.n == 0:
        return []
    c = p.max_comm() if c is None else c
    pos = {op: k for k, op in enumerate(p.topo)}
    entries = [i for i in range(p.n) if not p.preds[i]]
    cur = max(entries, key=lambda i: (rank[i], -pos[i]))
    path = [cur]
    while p.succs[cur]:
        cur = max(p.succs[cur], key=lambda je: (c[je[1]] + rank[je[0]], -pos[je[0]]))[0]
        path.append(cur)
    return path


def group_memory(p: Problem) -> dict[int, float]:
    mem: dict[int, float] = {}
    for i, g in enumerate(p.group):
        mem[g] = mem.get(g, 0.0) + p.mem[i]
    return mem


def critical_path_devices(p: Problem, cp: list[int], used: list[float],
                          gmem: dict[int, float], group_dev: dict[int, int]) -> dict[int, int]:
    """Critical-path op -> device. Fills ``used`` and ``group_dev`` with the reservations.

    For each device, simulate placing as many remaining critical-path ops as its memory holds
    and average their compute times there; take the device with the smallest average, then
    repeat for the rest when it is full.
    """
    cap = p.capacity
    assign: dict[int, int] = {}
    k = 0
    while k < len(cp):
        best = None
        for d in range(p.num_devices):
            u, m, total, seen = used[d], 0, 0.0, set()
            for i in cp[k:]:
                g = p.group[i]
                if g in group_dev and group_dev[g] != d:
                    break
                need = 0.0 if g in group_dev or g in seen else gmem[g]
                if u + need > cap[d]:
                    break
                u += need
                seen.add(g)
                total += p.w[i][d]
                m += 1
            if m and (best is None or (total / m, -m, d) < best[0]):
                best = ((total / m, -m, d), d, m, u, seen)
        if best is None:
            break  # the rest fits nowhere as a block: left to EFT, which reports it
        _, d, m, u, seen = best
        for i in cp[k:k + m]:
            assign[i] = d
        used[d] = u
        for g in seen:
            group_dev.setdefault(g, d)
        k += m
    return assign


@without_gc
def dpos(p: Problem) -> Schedule:
    """Place and order every op of ``p``; returns the predicted schedule."""
    n, D = p.n, p.num_devices
    c = p.max_comm()
    rank = rank_u(p, c)
    cp = critical_path(p, rank, c)
    gmem = group_memory(p)
    used = [0.0] * D
    group_dev: dict[int, int] = {}
    cp_dev = critical_path_devices(p, cp, used, gmem, group_dev)
    pos = {op: k for k, op in enumerate(p.topo)}
    visit = sorted(range(n), key=lambda i: (-rank[i], pos[i]))
    device, start, finish = eft_list_schedule(p, visit, gmem, used, group_dev, cp_dev)
    return Schedule(device, start, finish, critical_path=cp)


def eft_list_schedule(p: Problem, visit: list[int], gmem: dict[int, float],
                      used: list[float], group_dev: dict[int, int],
                      pinned: dict[int, int] | None = None, compiled: bool = True
                      ) -> tuple[list[int], list[float], list[float]]:
    """Each op, in ``visit`` order (each after its predecessors), to the device where it
    finishes first, found insertion-based (the earliest idle gap that fits); ``pinned`` ops to
    their device, a colocation group following its first member; a group's memory (``gmem``)
    reserved where it lands (``used``, ``group_dev``: updated). Device, start and finish per
    op. O((V + E) * D) plus the gap searches. Runs compiled (``_simcore``) where it was built
    and ``compiled``, else in Python; both give the same schedule."""
    if simcore is None or not compiled:
        return _eft_list_schedule(p, visit, gmem, used, group_dev, pinned or {})
    n, pinned = p.n, pinned or {}
    out = simcore.eft(
        p.num_devices, visit, p.w, p.preds, p.edge_bytes, p.intercept, p.slope, p.knee,
        p.extra, p.least_knee, p.group, [gmem.get(g, 0.0) for g in range(n)], p.capacity,
        used, [group_dev.get(g, -1) for g in range(n)], [pinned.get(i, -1) for i in range(n)])
    if isinstance(out, int):
        raise _fits_nowhere(p, out, gmem)
    device, start, finish, used[:], placed = out
    group_dev.update((g, d) for g, d in enumerate(placed) if d >= 0)
    return device, start, finish


def _eft_list_schedule(p: Problem, visit: list[int], gmem: dict[int, float],
                       used: list[float], group_dev: dict[int, int], pinned: dict[int, int]
                       ) -> tuple[list[int], list[float], list[float]]:
    """``eft_list_schedule`` in Python: the reference of ``_simcore``'s."""
    D, cap = p.num_devices, p.capacity
    device, start, finish = [-1] * p.n, [0.0] * p.n, [0.0] * p.n
    timelines = [Timeline() for _ in range(D)]
    for i in visit:
        g = p.group[i]
        placed = group_dev.get(g)
        if placed is not None:
            candidates = [placed]
        elif i in pinned:
            candidates = [pinned[i]]
        else:
            candidates = [d for d in range(D) if used[d] + gmem[g] <= cap[d]]
            if not candidates:
                raise _fits_nowhere(p, i, gmem)
        ready = ready_times(p, i, device, finish)
        best_d, best_st, best_ft = -1, 0.0, math.inf
        wi = p.w[i]
        for d in candidates:
            st = timelines[d].earliest(ready[d], wi[d])
            ft = st + wi[d]
            if ft < best_ft:
                best_d, best_st, best_ft = d, st, ft
        if placed is None:
            group_dev[g] = best_d
            used[best_d] += gmem[g]
        device[i], start[i], finish[i] = best_d, best_st, best_ft
        timelines[best_d].insert(best_st, best_ft)
    return device, start, finish


def _fits_nowhere(p: Problem, i: int, gmem: dict[int, float]) -> DoesNotFit:
    return DoesNotFit(f"op {p.names[i]!r} (with its colocation group, "
                      f"{gmem[p.group[i]]:.0f} bytes) fits in no device's remaining memory")
