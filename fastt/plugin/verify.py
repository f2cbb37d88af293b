"""The per-step equivalence check (``FASTT_VERIFY=1``): a strategy's first step is run again
on the original graph, from the same state on the same batch, and every value the step
fetched and every variable after it are compared (no TensorFlow here).

What may differ is reassociation: a rewrite adds in another order (a gradient summed over
replicas, the partial sums of a split op). Rounding a sum of n terms in another order moves
it by at most about ``n * eps`` of the sum of their magnitudes (Higham, *Accuracy and
Stability of Numerical Algorithms*, 2002, section 4.2), so a tensor is compared by its
largest absolute difference over its largest magnitude, against ``TOLERANCE`` of its dtype:
for float32 (eps 1.2e-7) 1e-4, about 840 eps, a sum of a thousand terms or a short chain of
such sums; float64 and 16-bit floats alike. Integers, booleans and strings must be equal. A
lost or reordered update moves a variable by a learning rate times its gradient, orders of
magnitude more.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}


@dataclass(frozen=True)
class Difference:
    """How far one tensor of the rewritten graph's step is from the original graph's."""
    name: str
    kind: str  # "fetch" or "variable"
    relative: float  # largest absolute difference over the largest magnitude (inf: unequal)
    tolerance: float

    @property
    def within(self) -> bool:
        return self.relative <= self.tolerance

    def __str__(self) -> str:
        return f"{self.kind} {self.name}: {self.relative:.3g} (tolerance {self.tolerance:g})"


def relative(reference: Any, value: Any) -> float:
    """The largest absolute difference between ``value`` and ``reference`` over the largest
    magnitude of ``reference`` (0 for equal tensors; inf for another shape, or any
    difference in a tensor that is not floating point)."""
    a, b = np.asarray(reference), np.asarray(value)
    if a.shape != b.shape:
        return math.inf
    if a.dtype.kind not in "fc" or b.dtype.kind not in "fc":
        return 0.0 if np.array_equal(a, b) else math.inf
    a64, b64 = a.astype(np.complex128 if a.dtype.kind == "c" else np.float64), \
        b.astype(np.complex128 if b.dtype.kind == "c" else np.float64)
    nan = np.isnan(a64) | np.isnan(b64)
    if np.any(np.isnan(a64) != np.isnan(b64)):
        return math.inf
    diff = np.abs(a64 - b64)[~nan]
    if diff.size == 0:
        return 0.0
    scale = float(np.max(np.abs(a64)[~nan]))
    worst = float(np.max(diff))
    return worst / scale if scale > 0 else (0.0 if worst == 0 else math.inf)


def tolerance(value: Any) -> float:
    return TOLERANCE.get(np.asarray(value).dtype.name, 0.0)


def differences(reference: Mapping[str, Any], values: Mapping[str, Any], kind: str
                ) -> list[Difference]:
    """Each tensor of ``reference`` against the same name in ``values`` (a name missing there
    differs without bound)."""
    return [Difference(name, kind, relative(ref, values[name]) if name in values
                       else math.inf, tolerance(ref))
            for name, ref in reference.items()]


def verdict(found: list[Difference]) -> str:
    """"" when every difference is within its tolerance; else one line naming the worst
    (and how many more)."""
    bad = sorted((d for d in found if not d.within), key=lambda d: -d.relative)
    if not bad:
        return ""
    more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
    return f"the step differs from the original graph's beyond reassociation: {bad[0]}{more}"


def record(path: str, strategy: str, found: list[Difference], skipped: str = "",
           step: int | None = None) -> None:
    """Append one check to ``path`` as a JSON line (``FASTT_VERIFY_REPORT``, what
    ``fastt verify`` reads): the strategy, each tensor's difference (``relative`` null where
    it differs without bound), or why the step was not checked."""
    doc = {"strategy": strategy, "step": step, "skipped": skipped, "verdict": verdict(found),
           "tensors": [{"name": d.name, "kind": d.kind, "tolerance": d.tolerance,
                        "relative": d.relative if math.isfinite(d.relative) else None}
                       for d in found]}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(doc) + "\n")


def read(path: str) -> list[dict[str, Any]]:
    """The checks ``record`` appended to ``path`` (none when it does not exist)."""
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []
