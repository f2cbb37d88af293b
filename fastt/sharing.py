"""Processor sharing: what each of several overlapping jobs on one server was charged.

A CPU device runs several kernels at once on the same cores (inter-op threads), and where
gRPC moves tensors between processes its threads take the same cores too; each kernel's own
start-to-end time then counts the others' work. ``processor_sharing`` charges each kernel its
share of the server instead: ``dt * 1 / (n + b)`` while ``n`` kernels and background work of
weight ``b`` (transfers, each weighted by the share of the cores it takes) are running.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

Span = tuple[int, int]  # start, end in nanoseconds


def processor_sharing(spans: Sequence[Span],
                      background: Sequence[tuple[int, int, float]] = ()
                      ) -> tuple[list[float], float]:
    """Each span's share of one server, in seconds, and the time a span was running.

    The spans share the server equally with each other and with the ``background`` intervals
    ``(start, end, weight)``, which take ``weight`` of a span's part each and are charged
    nothing here. Without background the shares add up to the busy time. O(k log k) for k
    intervals: the cumulative share ``S(t)`` is tabulated at every boundary and a span gets
    ``S(end) - S(start)``."""
    delta: dict[int, int] = defaultdict(int)
    for b, e in spans:
        if e > b:
            delta[b] += 1
            delta[e] -= 1
    weight: dict[int, float] = defaultdict(float)
    for b, e, w in background:
        if e > b and w > 0:
            weight[b] += w
            weight[e] -= w
    points = sorted({t for sp in spans for t in sp} | set(weight))
    cumulative: dict[int, float] = {}
    acc = busy = other = 0.0
    running = 0
    prev = points[0] if points else 0
    for t in points:
        if running:
            acc += (t - prev) / (running + max(other, 0.0))
            busy += t - prev
        cumulative[t] = acc
        running += delta[t]
        other += weight[t]
        prev = t
    return [(cumulative[e] - cumulative[b]) / 1e9 if e > b else 0.0 for b, e in spans], \
        busy / 1e9
