"""Where costs come from, behind one interface: ``CostSource``, what the scheduler and the
simulator read (they depend on it only). The sources:

- ``ModelCosts``: profiled, over ``CostModels`` (compute samples, link fits, probes);
- ``StaticCosts``: a table of per-op seconds (e.g. grappler's analytical estimates on simulated
  devices, ``tf_patches.grappler_costs``) and a device set's links;
- ``DerivedCosts`` (``fastt.costs.derived``): ops fastt created (sub-ops, replicas, joins)
  priced from another source before they are profiled.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping, Protocol, Sequence

if TYPE_CHECKING:
    from fastt.costs import CostModels


class CostSource(Protocol):
    """What a placer needs to know about costs (``CostModels`` adapts to it)."""

    def compute(self, op: str, device: str) -> float: ...

    # Optional: ``compute_row(op, devices) -> [seconds per device]``, used when present.

    def link(self, src: str, dst: str) -> tuple[float, float]:
        """(intercept seconds, slope seconds per byte) of the src -> dst path."""
        ...

    # Optional: ``transfer_cpu(src, dst) -> (sender share, receiver share[, sender seconds,
    # receiver seconds])``: the share of a transfer's time that the two devices' compute
    # streams spend on it, and the seconds of a call in a burst (``CommCostModel.burst_cpu``;
    # without them, the share of the latency); without the method, none;
    # ``step_overhead(devices_used=None, plan=None) -> seconds`` a step over that many
    # devices (of the plan of that ``Strategy.key``) takes beyond its ops and transfers
    # (None: the least; default 0);
    # ``device_step(device) -> seconds`` a step pays to run anything on ``device`` (a remote
    # worker's call; default 0); ``serve_delay(device) -> seconds`` at most a request for a
    # tensor waits for the device's busy cores (default 0); ``link_knee(src, dst) -> (bytes,
    # seconds per byte)``: past those bytes the path costs that much more per byte (default:
    # never).


class ModelCosts:
    """``CostSource`` over measured ``CostModels`` (unknown links cost 0: explore them)."""

    def __init__(self, models: "CostModels") -> None:
        self.models = models

    def compute(self, op: str, device: str) -> float:
        return self.models.compute.cost(op, device)

    def link(self, src: str, dst: str) -> tuple[float, float]:
        fit = self.models.comm.link(src, dst)
        return (0.0, 0.0) if fit is None else (max(fit.intercept, 0.0), max(fit.slope, 0.0))

    def link_knee(self, src: str, dst: str) -> tuple[float, float]:
        fit = self.models.comm.link(src, dst)
        return (math.inf, 0.0) if fit is None or fit.extra <= 0 else (fit.knee, fit.extra)

    def transfer_cpu(self, src: str, dst: str) -> tuple[float, float, float, float]:
        return (*self.models.comm.cpu_share(src, dst), *self.models.comm.burst_cpu(src, dst))

    def step_overhead(self, devices_used: int | None = None, plan: str | None = None
                      ) -> float:
        return self.models.step_overhead(devices_used, plan)

    def device_step(self, device: str) -> float:
        return self.models.reach(device)

    def serve_delay(self, device: str) -> float:
        return self.models.serve_delay(device)


class Links(Protocol):
    def link(self, src: str, dst: str) -> tuple[float, float]: ...


class StaticCosts:
    """A ``CostSource`` from a table of per-op seconds (the same on every device) and a
    device set's links; ops missing from the table cost 0."""

    def __init__(self, seconds: Mapping[str, float], device_set: Links) -> None:
        self.seconds, self.device_set = seconds, device_set

    def compute(self, op: str, device: str) -> float:
        return self.seconds.get(op, 0.0)

    def compute_row(self, op: str, devices: Sequence[str]) -> list[float]:
        """``compute`` on each of ``devices`` (one value for all)."""
        return [self.seconds.get(op, 0.0)] * len(devices)

    def link(self, src: str, dst: str) -> tuple[float, float]:
        return self.device_set.link(src, dst)
