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

A sum that cancels is the exception: the gradient of a bias just before a batch norm, or of an
attention key's bias (a softmax does not see it), is zero but for rounding, and so are the
optimizer slots that accumulate it; their values are the rounding error itself, and another
order of the sum gives other noise. Its terms are of the size of its siblings' (the tensors
of the same kind: the same last name component, every ``Adam`` slot, every ``biases``), so a
tensor *at the rounding level*, whose largest magnitude is below ``sqrt(eps)`` of the largest
of its kind, is compared over that largest magnitude instead of its own. Adam and RMSProp
divide by the gradient's own scale, so they turn such noise into full learning-rate steps
whose signs are the noise's: a variable whose optimizer slots (``name/Adam``, ...) are at the
rounding level may differ by up to twice the original graph's largest step of it (a step of
the same size the other way; its tolerance is 1 of that).
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
    return _over(*_measure(reference, value))


def _over(worst: float, scale: float) -> float:
    return worst / scale if scale > 0 else (0.0 if worst == 0 else math.inf)


def _measure(reference: Any, value: Any) -> tuple[float, float]:
    """(largest absolute difference, largest magnitude of ``reference``); the difference is
    inf for another shape, or any difference in a tensor that is not floating point."""
    a, b = np.asarray(reference), np.asarray(value)
    if a.shape != b.shape:
        return math.inf, 0.0
    if a.dtype.kind not in "fc" or b.dtype.kind not in "fc":
        return (0.0 if np.array_equal(a, b) else math.inf), 0.0
    a64, b64 = a.astype(np.complex128 if a.dtype.kind == "c" else np.float64), \
        b.astype(np.complex128 if b.dtype.kind == "c" else np.float64)
    nan = np.isnan(a64) | np.isnan(b64)
    if np.any(np.isnan(a64) != np.isnan(b64)):
        return math.inf, 0.0
    diff = np.abs(a64 - b64)[~nan]
    if diff.size == 0:
        return 0.0, 0.0
    return float(np.max(diff)), float(np.max(np.abs(a64)[~nan]))


def _kind_of(name: str) -> str:
    """The kind of tensor ``name`` is: its last name component (``w/Adam`` -> ``Adam``)."""
    return name.rsplit("/", 1)[-1].split(":")[0]


def tolerance(value: Any) -> float:
    return TOLERANCE.get(np.asarray(value).dtype.name, 0.0)


def differences(reference: Mapping[str, Any], values: Mapping[str, Any], kind: str,
                before: Mapping[str, Any] | None = None) -> list[Difference]:
    """Each tensor of ``reference`` against the same name in ``values`` (a name missing there
    differs without bound); a tensor at the rounding level over the largest of its kind; with
    ``before`` (the variables before the step), a variable driven by noise within its step."""
    measured = {name: _measure(ref, values[name]) if name in values else (math.inf, 0.0)
                for name, ref in reference.items()}
    largest: dict[tuple[str, str], float] = {}
    for name, (_, scale) in measured.items():
        key = (_kind_of(name), np.asarray(reference[name]).dtype.name)
        largest[key] = max(largest.get(key, 0.0), scale)
    noise: set[str] = set()  # at the rounding level
    for name, ref in reference.items():
        dtype = np.asarray(ref).dtype
        of_kind = largest[(_kind_of(name), dtype.name)]
        if dtype.kind in "fc" and measured[name][1] < \
                math.sqrt(float(np.finfo(dtype).eps)) * of_kind:
            noise.add(name)
    driven = {n.rsplit("/", 1)[0] for n in noise if "/" in n}  # variables of noisy slots
    out = []
    for name, ref in reference.items():
        worst, scale = measured[name]
        if before is not None and name in driven and name in before and name in values:
            step = _measure(ref, before[name])[0]  # the original graph's step, largest
            out.append(Difference(name, kind, _over(worst, 2 * step), 1.0))
            continue
        if name in noise:  # the residue of a sum that cancels
            scale = largest[(_kind_of(name), np.asarray(ref).dtype.name)]
        out.append(Difference(name, kind, _over(worst, scale), tolerance(ref)))
    return out


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
