"""Compute cost model: measured time of each (op, device), from profiled steps."""
from __future__ import annotations

from collections import deque
from typing import Any, Iterable

from fastt import devices
from fastt.profiler import ComputeSample

Key = tuple[str, str]  # (op name, full device name)


class ComputeCostModel:
    """Mean of the last ``window`` measured times per (op, device).

    A missing entry costs 0, FastT's choice: the scheduler is then drawn to try that placement
    and the next profile fills the entry. With ``fallback_same_type`` the time of the same op on
    another device of the same type (another GPU, another CPU) is used instead, when known.
    """

    def __init__(self, window: int = 10, fallback_same_type: bool = True) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self.fallback_same_type = fallback_same_type
        self._samples: dict[Key, deque[float]] = {}
        self._by_op: dict[str, dict[str, float]] = {}  # op -> device -> mean (cache)
        self._history: list[dict[Key, float]] = []  # means after each update()

    def update(self, samples: Iterable[ComputeSample]) -> None:
        """Add one profile's samples (one step or several) and remember the new means."""
        touched = set()
        for s in samples:
            key = (s.op, devices.canonical(s.device))
            q = self._samples.get(key)
            if q is None:
                q = self._samples[key] = deque(maxlen=self.window)
            q.append(float(s.seconds))
            touched.add(key)
        for op, dev in touched:
            self._by_op.setdefault(op, {})[dev] = self._mean((op, dev))
        self._history.append(self.means())
        del self._history[:-3]

    def _mean(self, key: Key) -> float:
        q = self._samples[key]
        return sum(q) / len(q)

    def means(self) -> dict[Key, float]:
        return {k: self._mean(k) for k in self._samples}

    def has(self, op: str, device: str) -> bool:
        return (op, device) in self._samples

    def cost(self, op: str, device: str) -> float:
        """Seconds of ``op`` on ``device``: measured mean, else same-type fallback, else 0."""
        per_dev = self._by_op.get(op)
        if not per_dev:
            return 0.0
        t = per_dev.get(device)
        if t is not None:
            return t
        if self.fallback_same_type:
            kind = devices.device_type(device)
            same = [v for d, v in per_dev.items() if devices.device_type(d) == kind]
            if same:
                return sum(same) / len(same)
        return 0.0

    def ops(self) -> set[str]:
        return set(self._by_op)

    def devices(self) -> set[str]:
        return {d for _, d in self._samples}

    def relative_change(self) -> float:
        """Time-weighted relative change of the means over the last update (inf before two).

        ``sum |mean_now - mean_before| / sum mean_before`` over the keys both updates know,
        plus the whole time of keys that appeared: small ops' jitter counts for what they
        weigh, not as 100% swings.
        """
        if len(self._history) < 2:
            return float("inf")
        before, now = self._history[-2], self._history[-1]
        base = sum(before.values())
        if base <= 0:
            return float("inf") if now else 0.0
        diff = sum(abs(v - before.get(k, 0.0)) if k in before else v for k, v in now.items())
        return diff / base

    def is_stable(self, threshold: float = 0.1) -> bool:
        """True when the last update moved the means by less than ``threshold`` (relative)."""
        return self.relative_change() < threshold

    def to_dict(self) -> dict[str, Any]:
        return {"window": self.window, "fallback_same_type": self.fallback_same_type,
                "samples": [[op, dev, list(q)] for (op, dev), q in self._samples.items()]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ComputeCostModel":
        model = cls(window=int(data.get("window", 10)),
                    fallback_same_type=bool(data.get("fallback_same_type", True)))
        model.update(ComputeSample(op, dev, t) for op, dev, ts in data.get("samples", [])
                     for t in ts)
        return model
