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
from fastt.ir import Graph
from fastt.sched.baselines import place_replicas
from fastt.sched.dpos import rank_u
from fastt.sched.problem import Problem
from fastt.sched.schedule import Schedule
from fastt.sched.simulate import simulate_fifo


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


LAYERS = 48  # the partitioner's layers: forward ops in topological order, about equal work


def _forward_of(name: str) -> str | None:
    """The forward op a TF1 gradient op was made for ("gradients/a/b_grad/Mul" -> "a/b"),
    or None when ``name`` is not under a gradients scope."""
    parts = name.split("/")
    scopes = [k for k, c in enumerate(parts) if c == "gradients" or c.startswith("gradients_")]
    if not scopes:
        return None
    rest = parts[scopes[-1] + 1:]
    for k, c in enumerate(rest):
        if c.endswith("_grad"):
            return "/".join(rest[:k] + [c[:-len("_grad")]])
    return ""


def layers(p: Problem, g: Graph, count: int = LAYERS) -> list[int]:
    """The layer (0..count-1) of each op of ``p`` (compiled from ``g``; a micro-batched
    graph's parts count as their op): the forward ops cut in topological order into layers of
    about equal work, forward and backward; a gradient op goes with the forward op it was
    made for, a colocation group (a variable, its reads and updates) with its first forward
    member, the rest with the ops they feed (else the ops feeding them)."""
    key = [g[n].meta.origin or n for n in p.names]
    back = [_forward_of(k) for k in key]
    after_back = [False] * p.n  # the backward pass and what follows it (the updates)
    for i in p.topo:
        after_back[i] = back[i] is not None or any(after_back[m] for m, _ in p.preds[i])
    forward = [i for i in p.topo if not after_back[i] and not g[p.names[i]].is_variable]
    # a source (a weight's read, a placeholder) goes where its first consumer is
    is_forward = [False] * p.n
    for i in forward:
        is_forward[i] = True
    rank = {i: float(k) for k, i in enumerate(forward)}
    sources = [i for i in reversed(forward) if not any(is_forward[m] for m, _ in p.preds[i])]
    for i in sources:
        rank[i] = min([rank[j] - 0.5 for j, _ in p.succs[i] if is_forward[j]],
                      default=rank[i])
    forward.sort(key=rank.__getitem__)
    work = [max(row) for row in p.w]
    position = {key[i]: k for k, i in enumerate(forward)}
    load = [0.0] * len(forward)
    for i in range(p.n):
        k = position.get(key[i] if back[i] is None else back[i] or "")
        if k is not None:
            load[k] += work[i]
    total, layer_of_position = sum(load) or 1.0, []
    done = 0.0
    for x in load:
        layer_of_position.append(min(int(done / total * count), count - 1))
        done += x
    layer: list[int | None] = [None] * p.n
    for i in range(p.n):
        k = position.get(key[i] if back[i] is None else back[i] or "")
        if k is not None:
            layer[i] = layer_of_position[k]
    for i in sources:  # in the layer of its first consumer (not just before it)
        after = [layer[j] for j, _ in p.succs[i] if is_forward[j] and layer[j] is not None]
        if after:
            layer[i] = min(after)  # type: ignore[type-var]
    first: dict[int, int] = {}
    for i in forward:
        if layer[i] is not None:
            first.setdefault(p.group[i], layer[i])  # type: ignore[arg-type]
    for i in range(p.n):
        if p.group[i] in first and back[i] is None:
            layer[i] = first[p.group[i]]
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
    """PipeDream's stages over the micro-batched graph ``g`` (``data_parallel(graph, m)``:
    micro-batch k = the ops ``X/part{k}``): its ``layers`` partitioned over the devices
    (``partition``, the links' slowest bandwidth) and placed by ``place_stages``. Each device
    runs its ready ops by decreasing upward rank (GPipe's fill and drain: the forward passes
    of the micro-batches before their backward passes), links carrying one bulk transfer at
    a time."""
    layer = layers(p, g)
    stages = partition(*_layer_costs(p, layer), p.num_devices, _bandwidth(p))[1]
    device = place_stages(p, g, layer, stages)
    r = simulate_fifo(p, device, link_concurrency=1, priority=rank_u(p))
    note = "stages: " + ", ".join(
        f"layers {st.first}-{st.last} on {st.replicas} device{'s' * (st.replicas > 1)}"
        for st in stages) + f" (of {max(layer) + 1} layers)"
    return Schedule(device, r.start, r.finish, note=note)


def place_stages(p: Problem, g: Graph, layer: list[int], stages: list[Stage]) -> list[int]:
    """The device of each op of ``g`` (compiled as ``p``, op i in ``layer[i]``): stage s on
    its own consecutive devices, micro-batch k of a stage on r replicas on its (k mod r)-th
    device, the ops the micro-batches share (the sums of their gradients, the updates,
    whole-batch ops) on the stage's first device (``place_replicas``)."""
    first_device, stage_of = [], [0] * (max(layer, default=0) + 1)
    for s_index, st in enumerate(stages):
        first_device.append(sum(x.replicas for x in stages[:s_index]))
        for x in range(st.first, st.last + 1):
            stage_of[x] = s_index

    def where(i: int, part: int | None) -> int:
        st = stage_of[layer[i]]
        return first_device[st] + (part or 0) % stages[st].replicas
    return place_replicas(p, g, where)


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
