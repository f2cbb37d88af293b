"""A schedule (device, start and finish of every op) and the per-device timeline placers fill."""
from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from fastt.sched.sim.problem import Problem


class Timeline:
    """Busy intervals of one device, in time order; finds the earliest idle gap that fits an op.

    Insertion-based (FastT's ``avail``): an op may go into a gap between ops already placed,
    not only after the last one. Intervals are kept in blocks, each knowing its largest gap
    (the gap before each of its intervals), so a search skips blocks where nothing fits: ops
    visited late with an early ready time do not scan a whole packed timeline.
    """
    __slots__ = ("_s", "_e", "_gmax", "_last")
    BLOCK = 64

    def __init__(self) -> None:
        self._s: list[list[float]] = []  # interval starts, per block
        self._e: list[list[float]] = []  # interval ends, per block
        self._gmax: list[float] = []  # largest gap before an interval of the block
        self._last: list[float] = []  # last end of each block (sorted: bisect finds blocks)

    @property
    def end(self) -> float:
        return self._last[-1] if self._last else 0.0

    def __len__(self) -> int:
        return sum(len(b) for b in self._s)

    def intervals(self) -> list[tuple[float, float]]:
        return [(a, b) for s, e in zip(self._s, self._e) for a, b in zip(s, e)]

    def earliest(self, ready: float, duration: float) -> float:
        """Earliest start >= ``ready`` of an idle gap at least ``duration`` long."""
        last = self._last
        b = bisect_right(last, ready)
        if b == len(last):
            return ready
        s, e = self._s[b], self._e[b]
        t = ready
        for k in range(bisect_right(e, ready), len(s)):
            if t + duration <= s[k]:
                return t
            if e[k] > t:
                t = e[k]
        gmax = self._gmax
        for bb in range(b + 1, len(last)):
            if gmax[bb] >= duration:  # some gap in this block fits; all start after t
                prev = last[bb - 1]
                for a, z in zip(self._s[bb], self._e[bb]):
                    if prev + duration <= a:
                        return prev
                    prev = z
        return last[-1]

    def insert(self, start: float, finish: float) -> None:
        if not self._s:
            self._s.append([start])
            self._e.append([finish])
            self._gmax.append(start)
            self._last.append(finish)
            return
        b = min(bisect_right(self._last, start), len(self._last) - 1)
        s, e = self._s[b], self._e[b]
        k = bisect_right(e, start)  # the new interval fills a gap: earlier ones end by start
        while k < len(s) and s[k] < start:  # ...up to rounding in the caller's arithmetic
            k += 1
        prev = e[k - 1] if k else (self._last[b - 1] if b else 0.0)
        if k == len(s):  # appended after the block's last interval: a new gap before it
            s.append(start)
            e.append(finish)
            self._last[b] = finish
            if start - prev > self._gmax[b]:
                self._gmax[b] = start - prev
            if b + 1 < len(self._s) and self._gmax[b + 1] == self._s[b + 1][0] - prev:
                self._refresh(b + 1)
        else:  # filled part of the gap before interval k: only that gap shrank
            filled = s[k] - prev
            s.insert(k, start)
            e.insert(k, finish)
            if filled >= self._gmax[b]:
                self._refresh(b)
        if len(s) > 2 * self.BLOCK:
            self._split(b)

    def _refresh(self, b: int) -> None:
        prev = self._last[b - 1] if b else 0.0
        best = 0.0
        for a, z in zip(self._s[b], self._e[b]):
            if a - prev > best:
                best = a - prev
            prev = z
        self._gmax[b] = best

    def _split(self, b: int) -> None:
        h = len(self._s[b]) // 2
        s, e = self._s[b], self._e[b]
        self._s[b:b + 1] = [s[:h], s[h:]]
        self._e[b:b + 1] = [e[:h], e[h:]]
        self._last[b:b + 1] = [e[h - 1], e[-1]]
        self._gmax[b:b + 1] = [0.0, 0.0]
        self._refresh(b)
        self._refresh(b + 1)


@dataclass
class Schedule:
    """Where and when every op of a ``Problem`` runs, as a placer predicts it."""
    device: list[int]
    start: list[float]
    finish: list[float]
    critical_path: list[int] = field(default_factory=list)
    note: str = ""  # what the placer says of it (the exact program: optimal, or its gap)

    @property
    def makespan(self) -> float:
        """Predicted step time: the finish time of the exit op (FT(exit))."""
        return max(self.finish, default=0.0)

    def order(self) -> list[int]:
        """The execution list A: ops by start time (then finish time, then index)."""
        # a stable sort by start, then finish: ties keep index order (4x a keyed sorted())
        return np.lexsort((np.asarray(self.finish, dtype=float),
                           np.asarray(self.start, dtype=float))).tolist()

    def device_orders(self, num_devices: int) -> list[list[int]]:
        per: list[list[int]] = [[] for _ in range(num_devices)]
        for i in self.order():
            per[self.device[i]].append(i)
        return per


def ready_times(p: Problem, i: int, device: list[int], finish: list[float]) -> list[float]:
    """Data-ready time of op ``i`` on each device, given its placed predecessors."""
    D = p.num_devices
    ready = [0.0] * D
    intercept, slope, nbytes, least_knee = p.intercept, p.slope, p.edge_bytes, p.least_knee
    for m, e in p.preds[i]:
        fm, dm = finish[m], device[m]
        b = nbytes[e]
        if b > least_knee[dm]:  # past some link's knee: the links' own costs
            for d in range(D):
                t = fm + p.transfer(dm, d, b)
                if t > ready[d]:
                    ready[d] = t
            continue
        row_i, row_s = intercept[dm], slope[dm]
        for d in range(D):
            t = fm if d == dm else fm + row_i[d] + row_s[d] * b
            if t > ready[d]:
                ready[d] = t
    return ready


def by_start(p: Problem, start: "Sequence[float] | np.ndarray") -> list[int]:
    """The ops of ``p`` by ``start`` (per op), never one before its predecessors (a solver's
    or a trace's start times may put an op before a predecessor by a rounding error); ties
    in ``p.topo``'s order. O((n + e) log n)."""
    pos = {i: k for k, i in enumerate(p.topo)}
    waiting = [len(p.preds[i]) for i in range(p.n)]
    ready = [(float(start[i]), pos[i], i) for i in range(p.n) if not waiting[i]]
    heapq.heapify(ready)
    out: list[int] = []
    while ready:
        _, _, i = heapq.heappop(ready)
        out.append(i)
        for j, _ in p.succs[i]:
            waiting[j] -= 1
            if not waiting[j]:
                heapq.heappush(ready, (float(start[j]), pos[j], j))
    return out


def executor_order(p: Problem, inline: Sequence[bool]) -> list[int]:
    """The order in which TensorFlow's executor runs the ops of ``p`` on one device with one
    inter-op thread; ``inline[i]``: op i's kernel is inexpensive (run on the thread that made
    it ready, in the order made ready). The inexpensive ops without inputs run first; then,
    each time an op finishes, the ops it makes ready are taken in the order of its output
    edges: the inexpensive ones queued to run inline, the last expensive one run inline too
    when nothing else is, and the other expensive ones pushed on the front of the thread's
    queue (the thread pool's own thread pops its queue from the front: last in, first out),
    which is read only when nothing is left to run inline. So one chain of expensive ops runs
    on while the branches it leaves wait, newest first: a recurrent net's top layer runs its
    whole backward pass before the layer below starts its own. O(n + e)."""
    waiting = [len(pred) for pred in p.preds]
    roots = [i for i in p.topo if not waiting[i]]
    queue = deque(i for i in roots if not inline[i])
    now = deque(i for i in roots if inline[i])
    out: list[int] = []
    while now or queue:
        if not now:
            now.append(queue.popleft())
        while now:
            i = now.popleft()
            out.append(i)
            last = -1  # the last expensive op made ready
            for j, _ in p.succs[i]:
                waiting[j] -= 1
                if waiting[j]:
                    continue
                if inline[j]:
                    now.append(j)
                    continue
                if last >= 0:
                    queue.appendleft(last)
                last = j
            if last >= 0:
                if now:
                    queue.appendleft(last)
                else:
                    now.append(last)
    return out
