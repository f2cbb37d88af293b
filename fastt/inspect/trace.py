"""One training step as a Chrome trace (Perfetto, chrome://tracing): predicted or measured.

Both kinds have the same layout: process ``k + 1`` is device ``k`` (the strategy's devices
first); its threads are lanes of ops (``ops``, ``ops 2``... wherever ops overlap: a CPU device
runs several kernels at once) and lanes of transfers into that device (``transfers``...). Op
events have ``cat`` ``op``, transfer events ``transfer``; ``args.device`` is the full device
name. ``otherData.fastt`` says the kind, the devices in process order, the step time and the
strategy (schema: ``fastt/schemas/trace.schema.json``).

``predicted`` replays a ``Strategy`` with the simulator; ``measured`` reads the step stats of
one traced step (a ``RunMetadata``, read by attribute: no TensorFlow here).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from fastt import devices as devnames
from fastt.costs.source import CostSource
from fastt.errors import FasttError
from fastt.ir import Graph, TensorRef
from fastt.op_types import IGNORED_NODES, TRANSFER_TYPES
from fastt.profiler import node_label
from fastt.sched.sim.problem import Device
from fastt.sched.strategy import Strategy, replay

SCHEMA_VERSION = 1
TRANSFER_TID = 1000  # first thread id of a device's transfer lanes


@dataclass
class Slice:
    """Something that ran on a device from ``start`` to ``end`` (seconds in the step)."""
    device: str
    start: float
    end: float
    name: str
    transfer: bool = False
    args: dict[str, Any] = field(default_factory=dict)


def predicted(strategy: Strategy, devices: Sequence[Device], costs: CostSource,
              original: Graph, copy_bytes_per_s: float = 10e9) -> dict[str, Any]:
    """The step ``strategy`` predicts under ``costs``: its placement and order (TensorFlow's
    own when it keeps none) replayed with contention-free links (its
    ``predicted_step_time_s``)."""
    p, r = replay(strategy, devices, costs, original, copy_bytes_per_s,
                  fifo=not strategy.ordered)
    names = [d.name for d in devices]
    slices = [Slice(names[r.device[i]], r.start[i], r.finish[i], p.names[i],
                    args={"type": strategy.graph[p.names[i]].type})
              for i in range(p.n)]
    for t in r.transfers:
        slices.append(Slice(names[t.dst], t.start, t.end, _tensor_name(t.tensor, p.names),
                            transfer=True, args={"src": names[t.src], "dst": names[t.dst],
                                                 "bytes": t.nbytes}))
    return build("predicted", names, slices, r.makespan, strategy.name)


def measured(run_metadata: Any, devices: Sequence[str], strategy: str = "") -> dict[str, Any]:
    """The step a ``RunMetadata`` (FULL_TRACE) recorded; ``devices`` come first, in order."""
    step_stats = getattr(run_metadata, "step_stats", None)
    if step_stats is None or not hasattr(step_stats, "dev_stats"):
        raise FasttError("not a RunMetadata: it has no step_stats.dev_stats")
    raw: list[tuple[str, int, int, str, bool, dict[str, Any]]] = []
    for dev in step_stats.dev_stats:
        device = _canonical(dev.device)
        for ns in dev.node_stats:
            if ns.node_name in IGNORED_NODES:
                continue
            kind, _ = node_label(ns)
            start = ns.all_start_nanos or 1000 * ns.all_start_micros
            transfer = ns.node_name == "RecvTensor" or kind in TRANSFER_TYPES
            if transfer:
                begin, end = start, start + _rel(ns, "all_end")
            else:
                begin, end = start + _rel(ns, "op_start"), start + _rel(ns, "op_end")
            raw.append((device, begin, max(end, begin), ns.node_name, transfer,
                        {"type": kind, "label": ns.timeline_label}))
    base = min((b for _, b, *_ in raw), default=0)
    slices = [Slice(d, (b - base) / 1e9, (e - base) / 1e9, name, transfer, args)
              for d, b, e, name, transfer, args in raw]
    order = list(dict.fromkeys([_canonical(d) for d in devices] + [s.device for s in slices]))
    return build("measured", order, slices, max((s.end for s in slices), default=0.0), strategy)


def build(kind: str, devices: Sequence[str], slices: Sequence[Slice], step_time_s: float,
          strategy: str = "") -> dict[str, Any]:
    """A Chrome trace document of ``slices`` on ``devices`` (process k + 1 is device k)."""
    pid = {d: k + 1 for k, d in enumerate(devices)}
    events: list[dict[str, Any]] = []
    for d, k in pid.items():
        events.append({"name": "process_name", "ph": "M", "pid": k,
                       "args": {"name": devnames.short(d)}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": k,
                       "args": {"sort_index": k}})
    for d, k in pid.items():
        for transfer, first, label in ((False, 0, "ops"), (True, TRANSFER_TID, "transfers")):
            mine = sorted((s for s in slices if s.device == d and s.transfer == transfer),
                          key=lambda s: (s.start, s.end))
            lanes = pack(mine)
            for lane in range(max(lanes, default=-1) + 1):
                events.append({"name": "thread_name", "ph": "M", "pid": k, "tid": first + lane,
                               "args": {"name": label if lane == 0 else f"{label} {lane + 1}"}})
            for s, lane in zip(mine, lanes):
                a, b = round(s.start * 1e9), round(s.end * 1e9)  # whole ns: lanes stay apart
                events.append({"name": s.name, "cat": "transfer" if transfer else "op",
                               "ph": "X", "pid": k, "tid": first + lane, "ts": a / 1e3,
                               "dur": (b - a) / 1e3, "args": {"device": d, **s.args}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"fastt": {"schema_version": SCHEMA_VERSION, "kind": kind,
                                    "devices": list(devices), "step_time_s": step_time_s,
                                    "strategy": strategy}}}


def pack(slices: Sequence[Slice]) -> list[int]:
    """A lane for each slice (sorted by start) so that slices of one lane never overlap."""
    ends: list[float] = []
    lanes = []
    for s in slices:
        lane = next((k for k, e in enumerate(ends) if e <= s.start), len(ends))
        if lane == len(ends):
            ends.append(s.end)
        else:
            ends[lane] = s.end
        lanes.append(lane)
    return lanes


@dataclass
class Row:
    """What a trace says about one device: its op and transfer intervals (seconds, lane)."""
    device: str
    ops: list[tuple[float, float, int]] = field(default_factory=list)
    transfers: list[tuple[float, float, int]] = field(default_factory=list)

    @property
    def busy_s(self) -> float:
        """Time at least one op ran (the union of the op intervals)."""
        total, reach = 0.0, float("-inf")
        for a, b, _ in sorted(self.ops):
            if b > reach:
                total += b - max(a, reach)
                reach = b
        return total


def rows(trace: dict[str, Any]) -> list[Row]:
    """Per device of a trace document (in its process order), its intervals."""
    info = trace.get("otherData", {}).get("fastt", {})
    out = [Row(d) for d in info.get("devices", [])]
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or not 1 <= e.get("pid", 0) <= len(out):
            continue
        a = e["ts"] / 1e6
        item = (a, a + e["dur"] / 1e6, e.get("tid", 0) % TRANSFER_TID)
        row = out[e["pid"] - 1]
        (row.transfers if e.get("cat") == "transfer" else row.ops).append(item)
    return out


def _rel(ns: Any, what: str) -> int:
    """A node's ``<what>_rel`` time in nanoseconds (from the micros field when needed)."""
    nanos = getattr(ns, f"{what}_rel_nanos", 0)
    return nanos if nanos > 0 else 1000 * getattr(ns, f"{what}_rel_micros", 0)


def _canonical(name: str) -> str:
    try:
        return devnames.canonical(name)
    except FasttError:
        return name


def _tensor_name(key: object, names: list[str]) -> str:
    if isinstance(key, TensorRef):
        return f"{key.op}:{key.index}"
    if isinstance(key, tuple) and len(key) == 2 and key[0] == "control":
        return f"^{names[key[1]]}" if isinstance(key[1], int) else f"^{key[1]}"
    return str(key)
