"""Pipeline stages: PipeDream's partitioner (Narayanan et al., "PipeDream: Generalized Pipeline
Parallelism for DNN Training", SOSP 2019, section 3.1) over fastt's op graph.

``partition(T, a, w, machines, bandwidth)`` cuts layers 0..N-1, taken in order, into stages
of consecutive layers, each run by some of ``machines`` identical devices (a stage on r > 1
devices is data parallel within itself), minimising the time of the slowest stage, which
sets the pipeline's throughput. With T(i..j, r) the time of a stage of layers i..j on r
devices,

    T(i..j, r) = max(sum T_l, sum W_l(r)) / r,   W_l(r) = 4 (r - 1) w_l / (r B)

(the compute of its layers, forward and backward, against the synchronisation of its
weights across the r replicas), and C_i = a_i / B the time to pass the cut after layer i:

    A(j, m) = min( T(0..j, m),  min over i < j, 1 <= r < m of
                                max(A(i, m - r), C_i, T(i+1..j, r)) )

PipeDream counts 2 C_i (the activations forward, their gradients back); fastt's ``a_i`` is
the larger direction of the cut, the two directions of a link being independent. The
answer is A(N-1, M) with every machine used. O(N^2 M^2) time, O(N M) memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from fastt.errors import FasttError


@dataclass(frozen=True)
class Stage:
    """Layers ``first``..``last`` (inclusive) on ``replicas`` devices."""
    first: int
    last: int
    replicas: int


def stage_time(compute: float, weights: float, r: int, bandwidth: float) -> float:
    """T(i..j, r) of a stage whose layers compute for ``compute`` seconds and hold
    ``weights`` bytes: the compute against the weights' synchronisation, per replica."""
    return max(compute, 4 * (r - 1) * weights / (r * bandwidth)) / r


def partition(T: Sequence[float], a: Sequence[float], w: Sequence[float], machines: int,
              bandwidth: float) -> tuple[float, list[Stage]]:
    """The slowest stage's time of the best pipeline of layers with compute ``T``, cut sizes
    ``a`` (bytes leaving layer i for the layers after it) and weights ``w`` (bytes) over
    ``machines`` devices joined by links of ``bandwidth`` bytes/s, and its stages in order."""
    N = len(T)
    if not (len(a) == len(w) == N) or N == 0:
        raise FasttError("partition needs as many cut sizes and weights as layers (>= 1)")
    if machines < 1 or bandwidth <= 0:
        raise FasttError(f"partition needs machines >= 1 and bandwidth > 0, not {machines}, "
                         f"{bandwidth}")
    prefix_t, prefix_w = [0.0], [0.0]
    for t, x in zip(T, w):
        prefix_t.append(prefix_t[-1] + t)
        prefix_w.append(prefix_w[-1] + x)

    def t_stage(i: int, j: int, r: int) -> float:
        return stage_time(prefix_t[j + 1] - prefix_t[i], prefix_w[j + 1] - prefix_w[i], r,
                          bandwidth)

    inf = float("inf")
    A = [[inf] * (machines + 1) for _ in range(N)]
    cut: list[list[tuple[int, int] | None]] = [[None] * (machines + 1) for _ in range(N)]
    for j in range(N):
        for m in range(1, machines + 1):
            best, arg = t_stage(0, j, m), None
            for i in range(j):
                c = a[i] / bandwidth
                if c >= best:
                    continue
                for r in range(1, m):
                    v = max(A[i][m - r], c, t_stage(i + 1, j, r))
                    if v < best:
                        best, arg = v, (i, r)
            A[j][m], cut[j][m] = best, arg
    stages: list[Stage] = []
    j, m = N - 1, machines
    while True:
        arg = cut[j][m]
        if arg is None:
            stages.append(Stage(0, j, m))
            break
        i, r = arg
        stages.append(Stage(i + 1, j, r))
        j, m = i, m - r
    return A[N - 1][machines], stages[::-1]



def balanced(T: Sequence[float], a: Sequence[float], w: Sequence[float], stages: int,
             replicas: int, bandwidth: float) -> tuple[float, list[Stage]]:
    """The best cut of the layers into exactly ``stages`` stages of ``replicas`` devices
    each (the same program with the stage count fixed and the machines split evenly:
    GPipe's pipelines, data parallel within each stage). O(S N^2)."""
    N = len(T)
    if not 1 <= stages <= N:
        raise FasttError(f"cannot cut {N} layers into {stages} stages")
    prefix_t, prefix_w = [0.0], [0.0]
    for t, x in zip(T, w):
        prefix_t.append(prefix_t[-1] + t)
        prefix_w.append(prefix_w[-1] + x)

    def t_stage(i: int, j: int) -> float:
        return stage_time(prefix_t[j + 1] - prefix_t[i], prefix_w[j + 1] - prefix_w[i],
                          replicas, bandwidth)

    inf = float("inf")
    A = [[t_stage(0, j) for j in range(N)]]
    cut: list[list[int]] = [[-1] * N]
    for s in range(1, stages):
        row, back = [inf] * N, [-1] * N
        for j in range(s, N):
            for i in range(s - 1, j):
                v = max(A[s - 1][i], a[i] / bandwidth, t_stage(i + 1, j))
                if v < row[j]:
                    row[j], back[j] = v, i
        A.append(row)
        cut.append(back)
    out, j = [], N - 1
    for s in range(stages - 1, -1, -1):
        i = cut[s][j] if s else -1
        out.append(Stage(i + 1, j, replicas))
        j = i
    return A[stages - 1][N - 1], out[::-1]
