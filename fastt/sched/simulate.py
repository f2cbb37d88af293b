"""Discrete-event simulation of one training step under a placement and per-device orders.

One compute stream per device runs its ops in the given order, each as soon as its inputs are
there. A tensor needed on another device is sent once per device when its producer finishes
(tensors are cached on the receiver) over the pair's link: ``intercept + slope * bytes``,
one transfer at a time per direction by default (``link_concurrency=None``: unlimited, DPOS's
own assumption, so replaying a DPOS schedule reproduces its predicted finish time).

Memory per device: persistent bytes for the whole step; an output from its producer's start
until its last consumer on that device has finished and its sends are done; a received tensor
from its transfer's start until its last consumer there has finished.
"""
from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field

from fastt.errors import FasttError
from fastt.sched.problem import Problem


@dataclass
class Transfer:
    tensor: object
    src: int
    dst: int
    nbytes: float
    start: float
    end: float


@dataclass
class SimResult:
    start: list[float]
    finish: list[float]
    device: list[int]
    transfers: list[Transfer] = field(default_factory=list)
    peak_memory: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)

    @property
    def makespan(self) -> float:
        return max(self.finish, default=0.0)


def simulate(p: Problem, device: list[int], orders: list[list[int]],
             link_concurrency: int | None = 1) -> SimResult:
    """Simulate ``p`` with op ``i`` on ``device[i]``, device ``d`` running ``orders[d]``."""
    n, D = p.n, p.num_devices
    if sorted(i for o in orders for i in o) != list(range(n)):
        raise FasttError("the device orders must list every op exactly once")
    for d, order in enumerate(orders):
        for i in order:
            if device[i] != d:
                raise FasttError(f"op {p.names[i]!r} is in device {d}'s order but placed on "
                                 f"device {device[i]}")
    # Tensors each op needs: (producer, key, bytes); remote ones are sent once per device.
    needs: list[list[tuple[int, object, float]]] = [[] for _ in range(n)]
    wanted: dict[int, dict[tuple[object, int], float]] = defaultdict(dict)  # producer -> (key, dst)
    for j in range(n):
        for m, e in p.preds[j]:
            tensors = p.edge_tensors[e] or [(("control", m), 0.0)]
            for key, nbytes in tensors:
                needs[j].append((m, key, nbytes))
                if device[m] != device[j]:
                    wanted[m][(key, device[j])] = nbytes

    start, finish = [0.0] * n, [-1.0] * n
    arrival: dict[tuple[object, int], float] = {}
    link_free: dict[tuple[int, int], list[float]] = {}
    transfers: list[Transfer] = []
    pos = [0] * D
    dev_free = [0.0] * D
    events: list[tuple[float, int]] = []  # (finish time, op)

    def try_start(d: int) -> None:
        while pos[d] < len(orders[d]):
            j = orders[d][pos[d]]
            t = dev_free[d]
            for m, key, _ in needs[j]:
                if finish[m] < 0:
                    return
                a = finish[m] if device[m] == d else arrival.get((key, d))
                if a is None:
                    return
                t = max(t, a)
            start[j], finish[j] = t, t + p.w[j][d]
            dev_free[d] = finish[j]
            pos[d] += 1
            heapq.heappush(events, (finish[j], j))
            if p.w[j][d] > 0:
                return  # the device is busy until that op's finish event

    for d in range(D):
        try_start(d)
    while events:
        t, m = heapq.heappop(events)
        src = device[m]
        for (key, dst), nbytes in sorted(wanted[m].items(), key=lambda kv: kv[0][1]):
            cost = p.intercept[src][dst] + p.slope[src][dst] * nbytes
            begin = t
            if link_concurrency is not None:
                lanes = link_free.setdefault((src, dst), [0.0] * link_concurrency)
                k = min(range(len(lanes)), key=lanes.__getitem__)
                begin = max(t, lanes[k])
                lanes[k] = begin + cost
            arrival[(key, dst)] = begin + cost
            transfers.append(Transfer(key, src, dst, nbytes, begin, begin + cost))
        for d in range(D):
            try_start(d)
    if any(f < 0 for f in finish):
        stuck = [p.names[i] for i in range(n) if finish[i] < 0][:5]
        raise FasttError(f"the orders deadlock (an op waits for one ordered after it): {stuck}")
    busy = [sum(p.w[i][d] for i in orders[d]) for d in range(D)]
    result = SimResult(start, finish, list(device), transfers, busy=busy)
    result.peak_memory = _peak_memory(p, result, needs)
    return result


def _peak_memory(p: Problem, r: SimResult,
                 needs: list[list[tuple[int, object, float]]]) -> list[float]:
    live: dict[tuple[object, int], list[float]] = {}  # (tensor, device) -> [alloc, free, bytes]

    def hold(key: object, d: int, a: float, b: float, nbytes: float) -> None:
        slot = live.get((key, d))
        if slot is None:
            live[(key, d)] = [a, b, nbytes]
        else:
            slot[0], slot[1] = min(slot[0], a), max(slot[1], b)

    for t in r.transfers:  # the sender holds its copy until sent; the receiver from the start
        hold(t.tensor, t.src, t.start, t.end, t.nbytes)
        hold(t.tensor, t.dst, t.start, t.end, t.nbytes)
    for j in range(p.n):
        for m, key, nbytes in needs[j]:
            hold(key, r.device[m], r.start[m], r.finish[m], nbytes)
            live[(key, r.device[j])][1] = max(live[(key, r.device[j])][1], r.finish[j])
    deltas: list[list[tuple[float, int, float]]] = [[] for _ in range(p.num_devices)]
    for (_, d), (a, b, nbytes) in live.items():
        deltas[d].append((a, 1, nbytes))
        deltas[d].append((b, 0, -nbytes))  # frees sort before allocations at the same time
    peaks = []
    for d in range(p.num_devices):
        base = sum(p.persistent[i] for i in range(p.n) if r.device[i] == d)
        cur = peak = 0.0
        for _, _, delta in sorted(deltas[d]):
            cur += delta
            peak = max(peak, cur)
        peaks.append(base + peak)
    return peaks
