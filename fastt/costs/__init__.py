"""Cost models built from real runs: compute, communication, memory; JSON in and out."""
from __future__ import annotations

import json
import os
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fastt import devices
from fastt.costs.comm import CommCostModel, LinkFit
from fastt.costs.compute import ComputeCostModel
from fastt.costs.memory import MemoryModel
from fastt.errors import CostModelError
from fastt.jsonio import read_json
from fastt.profiler import Profile

SCHEMA_VERSION = 1

__all__ = ["CostModels", "ComputeCostModel", "CommCostModel", "LinkFit", "MemoryModel"]


@dataclass
class CostModels:
    """The three models the strategy calculator reads, updated together from profiles."""
    compute: ComputeCostModel = field(default_factory=ComputeCostModel)
    comm: CommCostModel = field(default_factory=CommCostModel)
    memory: MemoryModel = field(default_factory=MemoryModel)
    overhead: deque[float] = field(default_factory=lambda: deque(maxlen=10))
    # device -> seconds a step pays to run anything there beyond the cheapest device (a
    # remote worker's call; probed: fastt.adapters.probe.probe_reach)
    device_step: dict[str, float] = field(default_factory=dict)
    # device -> seconds, at most, a request for a tensor it holds waits while its cores run a
    # kernel (probed: fastt.adapters.probe.probe_serve_delay; 0 where not probed)
    serve: dict[str, float] = field(default_factory=dict)

    def update(self, profile: Profile) -> None:
        """Feed one profiled step: compute samples, transfer samples, measured output sizes,
        and the step's time beyond its kernels (when the run was timed) less what reaching
        its devices costs, which is counted apart."""
        self.compute.update(profile.compute)
        self.comm.update(profile.transfers)
        self.memory.refine(profile.output_bytes)
        if profile.overhead_s is not None:
            used = {s.device for s in profile.compute}
            self.overhead.append(max(profile.overhead_s - max(
                (self.reach(d) for d in used), default=0.0), 0.0))

    def reach(self, device: str) -> float:
        """Seconds a step pays to run anything on ``device`` (0 where not probed)."""
        return self.device_step.get(devices.canonical(device), 0.0)

    def serve_delay(self, device: str) -> float:
        """Seconds, at most, ``device``'s busy cores keep a request for a tensor waiting (0
        where not probed)."""
        return self.serve.get(devices.canonical(device), 0.0)

    def step_overhead(self) -> float:
        """Seconds a step takes beyond what its ops and transfers take (the median of the
        last timed profiles; 0 before one)."""
        return float(statistics.median(self.overhead)) if self.overhead else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "compute": self.compute.to_dict(),
                "comm": self.comm.to_dict(), "memory": self.memory.to_dict(),
                "step_overhead_s": list(self.overhead), "device_step_s": self.device_step,
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
                   deque((float(v) for v in data.get("step_overhead_s", [])), maxlen=10),
                   {str(k): float(v) for k, v in data.get("device_step_s", {}).items()},
                   {str(k): float(v) for k, v in data.get("serve_delay_s", {}).items()})

    def save(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "CostModels":
        return cls.from_dict(read_json(path, "cost-model file", CostModelError))
