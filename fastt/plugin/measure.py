"""Step times a decision can rest on: the end of the warm-up, and which of two graphs is faster
(no TensorFlow here).

The warm-up ends where MSER-5 truncates the series (White, "An effective truncation heuristic
for bias reduction in simulation output", Simulation 69(6), 1997): over the means of batches of
5 steps, the truncation point ``d`` minimising the marginal standard error
``S^2(d) / (n - d)^2``, searched over the first half of the series; the series has settled
when that point lies strictly inside its first half (the rule's own validity condition),
enough steps follow it, and the two halves of what follows do not differ (by more than 5%,
significantly: see below).

Two graphs compare by the ratio of their median step times with a 95% bootstrap confidence
interval (percentile method; seeded, so a decision is reproducible from the samples in the
dump): faster when the whole interval lies below 1, slower when above, undecided otherwise,
and then more steps are measured. Consecutive steps are not independent (a machine slows
down for a while, not for one step): each sample is resampled in circular blocks of
consecutive steps (Politis and Romano, "A circular block-resampling procedure for stationary
data", 1992) whose length follows the sample's own autocorrelation (Politis and White,
"Automatic block-length selection for the dependent bootstrap", Econometric Reviews 23(1),
2004, with the correction of Patton, Politis and White, 2009); an independent sample gets
blocks of one step, the plain bootstrap. A comparison is also undecided when the machine's
other load changed between the two samples, unless the change worked against its verdict
(the candidate measured faster under more load, or slower under less), or its interval lies
beyond what the change can explain (``explained``: a graph using every core, sharing them in
proportion with the other load, slows by ``(cores + load after) / (cores + load before)``): a
win on a busy machine is kept.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BATCH = 5  # MSER-5
BOOTSTRAP = 2000
CONFIDENCE = 0.95
DRIFT = 0.05  # the two halves of a steady series differ by less, or not significantly
LOAD_CHANGE = 0.15  # of the machine's cores: more than this between two samples, re-measure
CAP = 6  # a series that never settles is sampled after warmup + CAP * its sample's steps


def mser5_truncation(times: list[float]) -> int:
    """The step index where MSER-5 ends the warm-up of ``times`` (a multiple of 5; 0 for
    series shorter than two batches)."""
    n = len(times) // BATCH
    if n < 2:
        return 0
    means = np.asarray(times[:n * BATCH], dtype=float).reshape(n, BATCH).mean(axis=1)
    # suffix sums give each truncation's mean and variance in one pass
    rev = means[::-1]
    count = np.arange(1, n + 1)
    mean = np.cumsum(rev) / count
    sq = np.cumsum(rev ** 2) / count
    mser = np.maximum(sq - mean ** 2, 0.0) / count  # S^2(d) / (n - d), in batch units
    mser = mser[::-1]  # index d: batches d..n-1 kept
    # Truncations past the middle are not searched: there the few batches left often have a
    # spuriously small variance (the rule's known weakness; it asks for d <= n/2 anyway).
    mser = mser[:n // 2 + 1]
    # the first minimum, up to rounding (a constant tail gives zeros that differ in the 1e-19s)
    d = int(np.flatnonzero(mser <= mser.min() + 1e-9 * float(means.var()))[0])
    return d * BATCH


def settled(times: list[float], min_steps: int) -> int | None:
    """Where the steady state of ``times`` starts, once at least ``min_steps`` settled steps
    follow it; None while still warming up (or too few steps)."""
    d = mser5_truncation(times)
    half = (len(times) // BATCH // 2) * BATCH
    if len(times) < 2 * BATCH or d >= half or len(times) - d < min_steps:
        return None  # a minimum at the middle: the warm-up may go on past it
    kept = times[d:]
    drift = compare(kept[:len(kept) // 2], kept[len(kept) // 2:])
    if drift.verdict != "undecided" and abs(drift.ratio - 1) > DRIFT:
        return None  # MSER truncates a warm-up; a level that moves later is not steady
    return d


def steady_start(times: list[float], warmup: int, need: int) -> tuple[int, bool] | None:
    """Where a sample of ``times`` of at least ``need`` steps starts, past ``warmup`` steps:
    once they have settled (``settled``), with True; if they never do, from
    ``warmup + CAP * need`` steps on, the last ``need`` steps then, with False; None before."""
    if len(times) < warmup + need:
        return None
    start = settled(times, need)
    if start is not None:
        return start, True
    if len(times) < warmup + CAP * need:
        return None
    return min(len(times) - need, warmup + (CAP - 1) * need), False


@dataclass(frozen=True)
class Verdict:
    """Candidate against baseline: ``ratio`` of median step times (below 1: the candidate is
    faster), its confidence interval, and what the rule concludes."""
    ratio: float
    low: float
    high: float
    confidence: float
    verdict: str  # "faster", "slower", "undecided" or "load changed"
    reason: str = ""

    def as_dict(self) -> dict[str, float | str]:
        return {"ratio": self.ratio, "ci_low": self.low, "ci_high": self.high,
                "confidence": self.confidence, "verdict": self.verdict, "reason": self.reason}


def compare(baseline: list[float], candidate: list[float], seed: int = 0,
            load_change: float = 0.0, confidence: float = CONFIDENCE,
            base_load: float | None = None, cores: int | None = None) -> Verdict:
    """Whether ``candidate``'s step times are faster than ``baseline``'s (see the module
    docstring); ``load_change``: how much the machine's other load moved between the two
    samples, in cores (``base_load``: the baseline's, on a machine of ``cores``);
    ``confidence``: of the interval (higher when one measurement looks several times, so that
    the looks together keep ``CONFIDENCE``)."""
    base, cand = np.asarray(baseline, float), np.asarray(candidate, float)
    if len(base) < 3 or len(cand) < 3:
        raise ValueError(f"need at least 3 step times on each side, got {len(base)} and "
                         f"{len(cand)}")
    ratio = float(np.median(cand) / np.median(base))
    rng = np.random.default_rng(seed)
    b = np.median(_resampled(base, rng), axis=1)
    c = np.median(_resampled(cand, rng), axis=1)
    tail = 100 * (1 - confidence) / 2
    low, high = (float(v) for v in np.percentile(c / b, [tail, 100 - tail]))
    verdict = "faster" if high < 1.0 else "slower" if low > 1.0 else "undecided"
    if abs(load_change) > LOAD_CHANGE:
        moved = f"the machine's other load moved by {load_change:+.2f} cores"
        if (verdict == "faster") == (load_change > 0) and verdict != "undecided":
            # the candidate ran under more load and still measured faster (or under less
            # and still slower): the load change only narrowed the gap; the verdict stands
            return Verdict(ratio, low, high, confidence, verdict, f"{moved}, against it")
        factor = explained(load_change, base_load, cores)
        # the candidate's interval as if at the baseline's load
        if verdict != "undecided" and factor is not None and \
                (high / factor < 1.0 if verdict == "faster" else low / factor > 1.0):
            return Verdict(ratio, low, high, confidence, verdict,
                           f"{moved}, which explains a factor {max(factor, 1 / factor):.2f} "
                           f"at most; {verdict} beyond it")
        return Verdict(ratio, low, high, confidence, "load changed", moved)
    return Verdict(ratio, low, high, confidence, verdict)


def explained(load_change: float, base_load: float | None, cores: int | None
              ) -> float | None:
    """The factor by which a load change of ``load_change`` cores, from ``base_load`` on a
    machine of ``cores``, can have scaled a graph's step at most: the step of a graph that
    would use every core, sharing them with the other load in proportion, scales as
    ``(cores + other load)``; below 1 when the machine got quieter. None when not known."""
    if base_load is None or not cores:
        return None
    after = max(base_load + load_change, 0.0)
    return (cores + after) / (cores + max(base_load, 0.0))


def block_length(x: np.ndarray) -> int:
    """Politis and White's (2004, corrected 2009) estimate of the optimal block length of the
    circular block bootstrap of ``x``: from the autocovariances up to ``M``, twice the first
    lag after which ``max(5, sqrt(log10 n))`` in a row are insignificant, through a flat-top
    lag window. 1 for a sample without autocorrelation; at most a third of the sample.
    O(n * M)."""
    n = len(x)
    d = x - x.mean()
    var = float(d @ d) / n
    if n < 8 or var <= 1e-18 * float(x.mean()) ** 2:  # a constant sample, up to rounding
        return 1
    k_n = max(5, int(np.ceil(np.sqrt(np.log10(n)))))
    m_max = int(np.ceil(np.sqrt(n))) + k_n
    lags = min(m_max + k_n, n - 1)
    acov = np.array([float(d[:n - k] @ d[k:]) / n for k in range(lags + 1)])
    insignificant = np.abs(acov[1:] / var) < 2.0 * np.sqrt(np.log10(n) / n)
    m = next((j for j in range(lags - k_n + 1) if insignificant[j:j + k_n].all()), m_max)
    big_m = min(2 * max(m, 1), m_max, lags)
    t = np.arange(1, big_m + 1) / big_m
    window = np.where(t <= 0.5, 1.0, 2.0 * (1.0 - t))  # the flat-top (trapezoid) lag window
    g = 2.0 * float(np.sum(window * np.arange(1, big_m + 1) * acov[1:big_m + 1]))
    spectrum0 = acov[0] + 2.0 * float(np.sum(window * acov[1:big_m + 1]))
    if g == 0.0 or spectrum0 <= 0.0:
        return 1
    b = (2.0 * g * g / ((4.0 / 3.0) * spectrum0 ** 2)) ** (1 / 3) * n ** (1 / 3)
    return int(min(max(1, round(b)), n // 3))


def _resampled(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``BOOTSTRAP`` circular block resamples of ``x`` (one per row), blocks of
    ``block_length(x)`` consecutive steps."""
    n, b = len(x), block_length(x)
    starts = rng.integers(0, n, (BOOTSTRAP, -(-n // b)))
    idx = (starts[:, :, None] + np.arange(b)).reshape(BOOTSTRAP, -1)[:, :n] % n
    return x[idx]
