"""Baechi's m-SCT (Jeon et al., SoCC 2020): Hanen and Munier's SCT (small communication times,
1995) with memory limits.

SCT solves a linear relaxation to choose each op's *favourite child*, the successor that
should run right after it on the same device so that their edge costs nothing:

    minimise  w
    s.t.      s_j >= s_i + p_i + c_ij * x_ij            for each edge i -> j
              s_i + p_i <= w                            for each op i
              sum_j x_ij >= |succ(i)| - 1               (at most one favourite child)
              sum_i x_ij >= |pred(j)| - 1               (at most one favourite parent)
              0 <= x_ij <= 1, s_i >= 0

with ``p_i`` an op's fastest compute time and ``c_ij`` its edge's largest transfer time. An edge
with ``x_ij < 1/2`` makes ``j`` the favourite child of ``i`` (the constraints allow at most one
per op). The LP is solved by HiGHS (``scipy.optimize.linprog``).

Two changes keep it small: an edge that carries no tensor (a control edge) is never a
favourite (``x_ij = 1``: there is nothing to keep local), and control edges are grouped into
complete bipartite blocks (sinks waiting for the same ops, or ops waited for by the same
sinks, whichever is fewer rows) that share a hub variable, ``s_j >= h >= s_i + p_i + c``
(every control edge costs the same latency ``c``); only sinks bound ``w``. The first changes
the relaxation, not only its size: Inception-v3's m-SCT plan on 8 V100s went from 182.3 to
174.6 ms. ``with tf.control_dependencies(update_ops)`` makes every gradient op of
ResNet-200 wait for its 400 moving-average updates: 316k control edges, which took HiGHS
520 s as variables and rows of their own and now take about 1 s. O(V + E_data + the blocks'
sizes) rows.

Placement is then m-ETF's list scheduling (``fastt.sched.placers.baselines.m_etf``) with one change:
a favourite child, once its parent is placed, may only go to its parent's device while that
device's memory holds it.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from fastt.errors import FasttError
from fastt.sched.sim.problem import Problem


def favourite_children(p: Problem) -> dict[int, int]:
    """Op -> its favourite child, from SCT's linear relaxation (ops with none are absent)."""
    c = p.max_comm()
    data = [(i, j, e) for i in range(p.n) for j, e in p.succs[i] if p.edge_tensors[e]]
    if not data:
        return {}
    control = [(i, j, e) for i in range(p.n) for j, e in p.succs[i] if not p.edge_tensors[e]]
    latency = max((c[e] for _, _, e in control), default=0.0)  # (no bytes: all the same)
    hubs = _bicliques([(i, j) for i, j, _ in control])
    n, m, H = p.n, len(data), len(hubs)
    cost = [min(row) for row in p.w]
    # variables: s_0..s_{n-1}, x_0..x_{m-1}, the hubs, w
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    ub: list[float] = []

    def row(entries: list[tuple[int, float]], bound: float) -> None:
        r = len(ub)
        for col, v in entries:
            rows.append(r)
            cols.append(col)
            vals.append(v)
        ub.append(bound)

    for k, (i, j, e) in enumerate(data):  # s_i - s_j + c_e x_e <= -p_i
        row([(i, 1.0), (j, -1.0), (n + k, c[e])], -cost[i])
    for h, (preds, sinks) in enumerate(hubs):
        for i in preds:  # s_i - h <= -p_i - c
            row([(i, 1.0), (n + m + h, -1.0)], -cost[i] - latency)
        for j in sinks:  # h - s_j <= 0
            row([(n + m + h, 1.0), (j, -1.0)], 0.0)
    w = n + m + H
    for i in range(n):  # s_i - w <= -p_i, for the sinks (the rest precede one)
        if not p.succs[i]:
            row([(i, 1.0), (w, -1.0)], -cost[i])
    out: list[list[int]] = [[] for _ in range(n)]
    into: list[list[int]] = [[] for _ in range(n)]
    for k, (i, j, _) in enumerate(data):
        out[i].append(k)
        into[j].append(k)
    for group in out + into:  # -sum x <= 1 - |group|
        if len(group) > 1:
            row([(n + k, -1.0) for k in group], 1.0 - len(group))
    a = coo_matrix((vals, (rows, cols)), shape=(len(ub), w + 1)).tocsr()
    objective = np.zeros(w + 1)
    objective[-1] = 1.0
    bounds = [(0, None)] * n + [(0, 1)] * m + [(0, None)] * (H + 1)
    res = linprog(objective, A_ub=a, b_ub=np.array(ub), bounds=bounds, method="highs")
    if res.status != 0:
        raise FasttError(f"m-SCT's linear program was not solved: {res.message}")
    x = res.x[n:n + m]
    return {i: j for k, (i, j, _) in enumerate(data) if x[k] < 0.5}


def _bicliques(edges: list[tuple[int, int]]) -> list[tuple[list[int], list[int]]]:
    """The edges as complete bipartite blocks (sources, sinks), each edge in one: sinks
    waiting for the same sources, or sources waited for by the same sinks, whichever needs
    fewer rows (|S| + |T| per block)."""
    def grouped(key_side: int) -> list[tuple[list[int], list[int]]]:
        other: dict[int, set[int]] = {}
        for edge in edges:
            other.setdefault(edge[key_side], set()).add(edge[1 - key_side])
        blocks: dict[frozenset[int], list[int]] = {}
        for k, ends in other.items():
            blocks.setdefault(frozenset(ends), []).append(k)
        return [(sorted(ends), ks) if key_side == 1 else (ks, sorted(ends))
                for ends, ks in blocks.items()]

    by_sinks, by_sources = grouped(1), grouped(0)
    return min(by_sinks, by_sources, key=lambda bs: sum(len(a) + len(b) for a, b in bs))
