"""Cost models built from real runs: compute, communication, memory; JSON in and out."""
from __future__ import annotations

import json
import os
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fastt import devices, schemas
from fastt.costs.comm import CommCostModel, LinkFit
from fastt.costs.compute import ComputeCostModel
from fastt.costs.memory import MemoryModel
from fastt.errors import CostModelError
from fastt.jsonio import interpreting, read_json
from fastt.profiler import Profile

SCHEMA_VERSION = 1

__all__ = ["CostModels", "ComputeCostModel", "CommCostModel", "LinkFit", "MemoryModel"]


@dataclass
class CostModels:
    """The three models the strategy calculator reads, updated together from profiles."""
    compute: ComputeCostModel = field(default_factory=ComputeCostModel)
    comm: CommCostModel = field(default_factory=CommCostModel)
    memory: MemoryModel = field(default_factory=MemoryModel)
    # seconds a step takes beyond its replay, per spread ("one" device, or "multi"): the
    # last timed profiles of each
    overhead: dict[str, deque[float]] = field(default_factory=lambda: _overheads({}))
    # device -> seconds a step pays to run anything there beyond the cheapest device (a
    # remote worker's call; probed: fastt.adapters.probe_cpu.probe_reach)
    device_step: dict[str, float] = field(default_factory=dict)
    # device -> seconds, at most, a request for a tensor it holds waits while its cores run a
    # kernel (probed: fastt.adapters.probe_cpu.probe_serve_delay; 0 where not probed)
    serve: dict[str, float] = field(default_factory=dict)
    # seconds a step takes beyond its replay, of each plan profiled over several devices or
    # measured untraced since (by ``Strategy.key``)
    plan_overhead: dict[str, deque[float]] = field(default_factory=dict)
    # the plans of ``plan_overhead`` known to run over several devices
    spread_plans: set[str] = field(default_factory=set)

    def update(self, profile: Profile, timed: bool = True) -> None:
        """Feed one profiled step: compute samples, transfer samples, measured output sizes,
        and (``timed``, when the run was timed) the step's time beyond its kernels less what
        reaching its devices costs, which is counted apart. A caller that replays the
        profiled plan itself passes ``timed=False`` and records what the replay leaves out
        (``record_overhead``)."""
        self.compute.update(profile.compute)
        self.comm.update(profile.transfers)
        self.memory.refine(profile.output_bytes)
        if timed and profile.overhead_s is not None:
            used = {s.device for s in profile.compute}
            self.record_overhead(max(profile.overhead_s - max(
                (self.reach(d) for d in used), default=0.0), 0.0), len(used))

    def record_overhead(self, seconds: float, devices_used: int, plan: str | None = None,
                        again: bool = False) -> None:
        """What a timed step over ``devices_used`` devices (of the plan of that
        ``Strategy.key``) took beyond its replay (reach included): on several devices it may
        be negative, where the replay runs longer. ``again``: the same untraced sample as the
        plan's last record (``calibrate``)."""
        self.overhead[_spread(devices_used)].append(float(seconds))
        if plan is not None and devices_used > 1:
            self.calibrate(plan, seconds, again, devices_used)

    def calibrate(self, plan: str, seconds: float, again: bool = False,
                  devices_used: int | None = None) -> None:
        """What a steady sample of untraced steps of the plan of that ``Strategy.key`` (on any
        number of devices) took beyond its replay: one more record of its own overhead, the
        median of which it pays from now on. Kept beside the older records, not in their
        place: a fresh session's first sample may be far from its later steps (a
        data-parallel Inception's at 48.3 ms, against 36.4 when profiled and 39.6 in its
        timed blocks on the real testbed). With ``again``, the same sample as the last record,
        replayed over models updated since (a profile's next traced step), takes its place:
        one sample, one record, however many steps were traced beside it. ``devices_used``:
        over how many devices the plan runs (None: not known)."""
        if devices_used is not None and devices_used > 1:
            self.spread_plans.add(plan)
        records = self.plan_overhead.setdefault(plan, deque(maxlen=10))
        if again and records:
            records.pop()
        records.append(float(seconds))

    def reach(self, device: str) -> float:
        """Seconds a step pays to run anything on ``device`` (0 where not probed)."""
        return self.device_step.get(devices.canonical(device), 0.0)

    def serve_delay(self, device: str) -> float:
        """Seconds, at most, ``device``'s busy cores keep a request for a tensor waiting (0
        where not probed)."""
        return self.serve.get(devices.canonical(device), 0.0)

    def step_overhead(self, devices_used: int | None = None, plan: str | None = None
                      ) -> float:
        """Seconds a step over ``devices_used`` devices takes beyond what its ops and
        transfers take; None: the least of the spreads (a bound); 0 before a profile.

        A plan measured before (``plan``, its ``Strategy.key``: profiled over several
        devices, or ``calibrate``d) pays its own. Another on one device: the median of the
        last timed profiles on one device (else of those over several). Another over several:
        the median of what the plans over several devices measured before pay, one vote each
        (a plan's own median), so that one plan's miscalibrated sample does not set them all;
        before any, one device's (the probed reach of each device is in its replay already).
        (The evidence, run by run: ``benchmarks/results/REPORT.md``.)"""
        if devices_used is None:
            known = [_median(q) for q in self.overhead.values() if q]
            return min(known) if known else 0.0
        own = self.plan_overhead.get(plan) if plan is not None else None
        if own:
            return _median(own)
        votes = [_median(q) for k, q in self.plan_overhead.items()
                 if k in self.spread_plans and q]
        if devices_used > 1 and votes:
            return float(statistics.median(votes))
        one, multi = self.overhead["one"], self.overhead["multi"]
        return _median(one or multi) if one or multi else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "compute": self.compute.to_dict(),
                "comm": self.comm.to_dict(), "memory": self.memory.to_dict(),
                "step_overhead_s": {k: list(q) for k, q in self.overhead.items()},
                "plan_overhead_s": {k: list(q) for k, q in self.plan_overhead.items()},
                "spread_plans": sorted(self.spread_plans),
                "device_step_s": self.device_step,
                "serve_delay_s": self.serve}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CostModels":
        if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
            raise CostModelError(
                f"not a fastt cost-model document (schema_version "
                f"{data.get('schema_version') if isinstance(data, dict) else None!r}, "
                f"expected {SCHEMA_VERSION})")
        return cls(ComputeCostModel.from_dict(data.get("compute", {})),
                   CommCostModel.from_dict(data.get("comm", {})),
                   MemoryModel.from_dict(data.get("memory", {})),
                   _overheads(data.get("step_overhead_s", {})),
                   {str(k): float(v) for k, v in data.get("device_step_s", {}).items()},
                   {str(k): float(v) for k, v in data.get("serve_delay_s", {}).items()},
                   {str(k): deque((float(x) for x in v), maxlen=10)
                    for k, v in data.get("plan_overhead_s", {}).items()},
                   {str(k) for k in data.get("spread_plans", [])})

    def save(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "CostModels":
        """The cost models saved in ``path``: ``CostModelError`` naming the file when it is
        not a cost-model document (``fastt/schemas/cost_models.schema.json``)."""
        what = "cost-model file"
        doc = read_json(path, what, CostModelError, expect=dict)
        if doc.get("schema_version") != SCHEMA_VERSION:
            raise CostModelError(f"{what} {os.fspath(path)!r} is not a fastt cost-model "
                                 f"document (schema_version {doc.get('schema_version')!r}, "
                                 f"expected {SCHEMA_VERSION})")
        found = schemas.errors(doc, schemas.load("cost_models"))
        if found:
            raise CostModelError(f"{what} {os.fspath(path)!r} does not follow the cost_models "
                                 "schema: " + "; ".join(found[:3]))
        with interpreting(path, what, CostModelError):
            return cls.from_dict(doc)


SPREADS = ("one", "multi")


def _spread(devices_used: int) -> str:
    return "multi" if devices_used > 1 else "one"


def _median(values: deque[float]) -> float:
    return float(statistics.median(values))


def _overheads(data: Any) -> dict[str, deque[float]]:
    """The overheads of a document: per spread (an older list: steps on one device)."""
    if isinstance(data, list):
        data = {"one": data}
    if not isinstance(data, dict):
        raise CostModelError(f"step_overhead_s is neither a list nor a mapping: {data!r}")
    return {k: deque((float(v) for v in data.get(k, [])), maxlen=10) for k in SPREADS}
