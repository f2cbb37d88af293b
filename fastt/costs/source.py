"""Where costs come from, behind one interface: ``CostSource``, what the scheduler and the
simulator read (they depend on it only). A source implements ``compute`` and ``link`` and
overrides what else it knows; the base class says what each optional method means and its
default. The sources:

- ``ModelCosts``: profiled, over ``CostModels`` (compute samples, link fits, probes);
- ``StaticCosts``: a table of per-op seconds (e.g. grappler's analytical estimates on simulated
  devices, ``tf_patches.grappler_costs``) and a device set's links;
- ``DerivedCosts`` (``fastt.costs.derived``): ops fastt created (sub-ops, replicas, joins)
  priced from another source before they are profiled.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

if TYPE_CHECKING:
    from fastt.costs import CostModels


class CostSource:
    """What a placer needs to know about costs: ``compute`` and ``link`` (required), and
    the optional methods below, whose defaults say "nothing known"."""

    def compute(self, op: str, device: str) -> float:
        """Seconds ``op`` takes on ``device``."""
        raise NotImplementedError

    def link(self, src: str, dst: str) -> tuple[float, float]:
        """(intercept seconds, slope seconds per byte) of the src -> dst path."""
        raise NotImplementedError

    def compute_row(self, op: str, devices: Sequence[str]) -> list[float]:
        """``compute`` on each of ``devices`` (override where one call is cheaper)."""
        return [self.compute(op, d) for d in devices]

    def link_knee(self, src: str, dst: str) -> tuple[float, float]:
        """(bytes, seconds per byte): past those bytes the path costs that much more per
        byte (default: never)."""
        return (math.inf, 0.0)

    def transfer_cpu(self, src: str, dst: str) -> tuple[float, ...]:
        """(sender share, receiver share[, sender seconds, receiver seconds]): the share of
        a transfer's time the two devices' compute streams spend on it, and the seconds of
        a call in a burst (``CommCostModel.burst_cpu``; without them, the share of the
        latency). Default: none."""
        return (0.0, 0.0)

    def step_overhead(self, devices_used: int | None = None, plan: str | None = None
                      ) -> float:
        """Seconds a step over ``devices_used`` devices (of the plan of that
        ``Strategy.key``) takes beyond its ops and transfers (None: the least). Default 0;
        a source that knows it overrides this (``knows_step_overhead``)."""
        return 0.0

    def device_step(self, device: str) -> float:
        """Seconds a step pays to run anything on ``device`` (a remote worker's call)."""
        return 0.0

    def serve_delay(self, device: str) -> float:
        """Seconds at most a request for a tensor waits for ``device``'s busy cores."""
        return 0.0


def knows_step_overhead(costs: Any) -> bool:
    """Whether ``costs`` overrides ``CostSource.step_overhead`` (a plan's key, which that
    method reads, is not computed for nothing)."""
    return type(costs).step_overhead is not CostSource.step_overhead


class ModelCosts(CostSource):
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


class StaticCosts(CostSource):
    """A ``CostSource`` from a table of per-op seconds (the same on every device, but
    ``slowdown[device]`` times that on the devices it names) and a device set's links; ops
    missing from the table cost 0. The table may be a function that returns it, called when
    a cost is first read (the table can be computed on another core meanwhile)."""

    def __init__(self, seconds: Mapping[str, float] | Callable[[], Mapping[str, float]],
                 device_set: Links, slowdown: Mapping[str, float] | None = None) -> None:
        self._seconds, self.device_set = seconds, device_set
        self.slowdown = dict(slowdown or {})

    @property
    def seconds(self) -> Mapping[str, float]:
        """The table of per-op seconds."""
        if callable(self._seconds):
            self._seconds = self._seconds()
        return self._seconds

    def compute(self, op: str, device: str) -> float:
        return self.seconds.get(op, 0.0) * self.slowdown.get(device, 1.0)

    def compute_row(self, op: str, devices: Sequence[str]) -> list[float]:
        """``compute`` on each of ``devices``."""
        t = self.seconds.get(op, 0.0)
        if not self.slowdown:
            return [t] * len(devices)
        return [t * self.slowdown.get(d, 1.0) for d in devices]

    def link(self, src: str, dst: str) -> tuple[float, float]:
        return self.device_set.link(src, dst)
