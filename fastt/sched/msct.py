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
per op). The LP is solved by HiGHS (``scipy.optimize.linprog``): O(V + E) variables and rows.

Placement is then m-ETF's list scheduling (``fastt.sched.baselines.m_etf``) with one change: a
favourite child, once its parent is placed, may only go to its parent's device while that
device's memory holds it.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from fastt.errors import FasttError
from fastt.sched.problem import Problem


def favourite_children(p: Problem) -> dict[int, int]:
    """Op -> its favourite child, from SCT's linear relaxation (ops with none are absent)."""
    edges = [(i, j, e) for i in range(p.n) for j, e in p.succs[i]]
    if not edges:
        return {}
    n, m = p.n, len(edges)
    c = p.max_comm()
    cost = [min(row) for row in p.w]
    # variables: s_0..s_{n-1}, x_0..x_{m-1}, w
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

    for k, (i, j, e) in enumerate(edges):  # s_i - s_j + c_e x_e <= -p_i
        row([(i, 1.0), (j, -1.0), (n + k, c[e])], -cost[i])
    for i in range(n):  # s_i - w <= -p_i
        row([(i, 1.0), (n + m, -1.0)], -cost[i])
    out: list[list[int]] = [[] for _ in range(n)]
    into: list[list[int]] = [[] for _ in range(n)]
    for k, (i, j, _) in enumerate(edges):
        out[i].append(k)
        into[j].append(k)
    for group in out + into:  # -sum x <= 1 - |group|
        if len(group) > 1:
            row([(n + k, -1.0) for k in group], 1.0 - len(group))
    a = coo_matrix((vals, (rows, cols)), shape=(len(ub), n + m + 1)).tocsr()
    objective = np.zeros(n + m + 1)
    objective[-1] = 1.0
    bounds = [(0, None)] * n + [(0, 1)] * m + [(0, None)]
    res = linprog(objective, A_ub=a, b_ub=np.array(ub), bounds=bounds, method="highs")
    if res.status != 0:
        raise FasttError(f"m-SCT's linear program was not solved: {res.message}")
    x = res.x[n:n + m]
    return {i: j for k, (i, j, _) in enumerate(edges) if x[k] < 0.5}
