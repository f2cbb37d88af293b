"""Costs of ops that fastt created (sub-ops, replicas, splits, joins) before they are profiled.

A sub-op or replica costs ``overhead + (t_whole - overhead) * fraction``, where ``fraction`` is
its share of the whole op's work and ``overhead`` the fixed per-launch time of its op type,
fitted as the intercept of a linear regression of measured time on analytical work over the
measured ops of that type. A split, concat or sum costs its bytes at the device's copy rate
(never its name's measured time: a join carries the name of the op it replaced). Sub-ops
measured under their own name keep their measured time.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import numpy as np

from fastt.ir.flops import flops
from fastt.costs.source import CostSource
from fastt.ir import Graph, Op
from fastt.op_types import ALIASING_TYPES, COPY_TYPES


def fit_overheads(graph: Graph, base: CostSource, device: str,
                  work: dict[str, float] | None = None) -> dict[str, float]:
    """Op type -> fixed per-op time on ``device`` (regression intercept, clamped to
    [0, the type's fastest measured op]); types with fewer than 3 measured ops get 0.
    ``work``: a cache of the ops' analytical work (``flops``), shared by the devices' fits."""
    samples: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for op in graph:
        if op.meta.origin is not None:
            continue
        t = base.compute(op.name, device)
        if t > 0:
            f = work.get(op.name) if work is not None else None
            if f is None:
                f = flops(op, graph)
                if work is not None:
                    work[op.name] = f
            samples[op.type].append((f, t))
    out = {}
    for typ, pts in samples.items():
        if len(pts) < 3 or len({x for x, _ in pts}) < 2:
            out[typ] = 0.0
            continue
        x = np.array([p[0] for p in pts])
        y = np.array([p[1] for p in pts])
        intercept = float(np.polynomial.polynomial.polyfit(x, y, 1)[0])  # least squares
        out[typ] = min(max(intercept, 0.0), float(y.min()))
    return out


class Overheads:
    """``fit_overheads`` of one original graph, per device, fitted once and shared (the
    ops' work counted once for all devices)."""

    def __init__(self, original: Graph, base: CostSource) -> None:
        self.original, self.base = original, base
        self._fits: dict[str, dict[str, float]] = {}
        self._work: dict[str, float] = {}

    def get(self, typ: str, device: str) -> float:
        if device not in self._fits:
            self._fits[device] = fit_overheads(self.original, self.base, device, self._work)
        return self._fits[device].get(typ, 0.0)


class DerivedCosts(CostSource):
    """A ``CostSource`` for a transformed ``graph`` over a ``CostSource`` of the original."""

    def __init__(self, base: CostSource, graph: Graph, overheads: Overheads,
                 copy_bytes_per_s: float = 10e9,
                 memo: dict[tuple[object, ...], list[float]] | None = None) -> None:
        self.base, self.graph, self.overheads = base, graph, overheads
        self.copy_bytes_per_s = copy_bytes_per_s
        self.memo = memo if memo is not None else {}  # shared by the graphs of one search

    def compute(self, op: str, device: str) -> float:
        return self.compute_row(op, (device,))[0]

    def compute_row(self, op: str, devices: Sequence[str]) -> list[float]:
        """Seconds of ``op`` on each of ``devices``, memoised across the graphs of a search
        (an op that a split did not touch is not costed again; a join, which carries the name
        and may carry the type of the op it replaced, is keyed apart from it)."""
        o = self.graph[op]
        key = (op, o.type, o.meta.fraction, o.meta.join is not None,
               o.outputs[0].nbytes if o.outputs else None, tuple(devices))
        row = self.memo.get(key)
        if row is None:
            row = self.memo[key] = self._row(o, devices)
        return row

    def _base_row(self, op: str, devices: Sequence[str]) -> list[float]:
        return list(self.base.compute_row(op, devices))

    def _row(self, o: Op, devices: Sequence[str]) -> list[float]:
        origin = o.meta.origin
        if origin is not None:
            measured = self._base_row(o.name, devices)  # profiled under its own name already?
            if all(t > 0 for t in measured):
                return measured
            # the same share of the same op, as the replicas of one op are: priced once
            key = ("share", origin, o.type, o.meta.fraction, tuple(measured), tuple(devices))
            out = self.memo.get(key)
            if out is None:
                out = self.memo[key] = self._share(o, origin, measured, devices)
            return out
        if o.meta.split_of or o.meta.join is not None:
            # Never priced by name: a join carries the name of the op it replaced; views
            # (a reshape, an identity) move no bytes.
            if o.type in ALIASING_TYPES:
                return [0.0] * len(devices)
            if o.type in COPY_TYPES:
                return [sum(t.nbytes or 0 for t in o.outputs) / self.copy_bytes_per_s] * \
                    len(devices)
        return self._base_row(o.name, devices)

    def _share(self, o: Op, origin: str, measured: list[float], devices: Sequence[str]
               ) -> list[float]:
        """Seconds of ``o``, a share of ``origin``'s work, where it was not measured."""
        whole, fraction = self._base_row(origin, devices), o.meta.fraction
        out = []
        for d, t, w in zip(devices, measured, whole):
            if t <= 0:
                fixed = min(self.overheads.get(o.type, d), w)
                t = fixed + (w - fixed) * fraction
            out.append(t)
        return out

    def link(self, src: str, dst: str) -> tuple[float, float]:
        return self.base.link(src, dst)

    def link_knee(self, src: str, dst: str) -> tuple[float, float]:
        return self.base.link_knee(src, dst)

    def transfer_cpu(self, src: str, dst: str) -> tuple[float, ...]:
        return self.base.transfer_cpu(src, dst)

    def device_step(self, device: str) -> float:
        return self.base.device_step(device)

    def serve_delay(self, device: str) -> float:
        return self.base.serve_delay(device)
