"""Communication cost model: transfer time = intercept + slope * bytes, per device pair (past a
knee, a second slope: see below).

One linear fit per (src, dst) pair, refitted when new samples arrive (FastT, section 4): the
fit captures each path's bandwidth and latency. The fit is a lower-decile regression
(``sklearn.linear_model.QuantileRegressor``, HiGHS), not least squares: a traced transfer's time
also counts the wait for the sender's or the receiver's busy cores and for other transfers on
the link, which only ever add time and which the simulator models itself (on the real
testbed least squares over traced transfers put the per-transfer latency at 2-13 ms where the
idle link takes 0.1 ms). The link probe's samples (``PROBED``) are filtered already (each the
lower quartile of its repeats on an idle link): a pair that has only those is fitted by the
median line on relative errors, since a decile of its 8 points is their lower envelope, which
one low point tilts. So is a probed pair whose transfers take its ends' cores (``cpu_share``):
there every traced transfer of a step also waited for the cores its own step kept busy, which
the simulator charges itself through the shares; fitting the link on them too counted that
wait twice (on the 2-worker testbed, VGG-mixed: the traced decile 0.71 and 1.12 ns/byte, the
idle link 0.45 and 0.33; data parallelism predicted at 324 ms where it measured 229 ms, and at
234 ms from the probe).
Besides the link, a transfer takes a share of the two ends' compute (``cpu_share``): where
the cores move the bytes (gRPC between processes) the planner counts it. Alone, a transfer's
call (its latency) takes that share too: 0.07 ms of each end measured for a call between two
single-core workers here, against a latency of 0.13 ms and shares of 0.6-1.0. In a burst
(the end moving other transfers), gRPC serves several calls a wake-up and a call takes
0.02-0.04 ms (``burst_cpu``, probed): charged the whole share, the ~160 small tensors of
data parallelism with its variables on one worker (Inception-like) took 28 ms of the two
cores, and the step was predicted at 54 ms where it measured 42.
A probed pair whose large sizes cost more per byte than its small ones gets a hinge: past a
knee (one of the probed sizes), each byte costs ``extra`` more. Between two single-core gRPC
workers here an idle link moved 16 MiB in 14.7 ms, 32 MiB in 40.2 and 64 MiB in 118.9 (the
line through 1 KiB-16 MiB put 64 MiB at 30-36 ms); AlexNet's 64 MiB gradients took 71-145 ms
in training. The hinge is kept only where the probe's points support it: at least
``KNEE_POINTS`` sizes past the knee, and ``KNEE_GAIN`` less summed relative error than the
line. Traced samples are fitted by a line only.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from fastt import devices
from fastt.profiler import TransferSample

Pair = tuple[str, str]
QUANTILE = 0.1
PROBED = "probe"  # TransferSample.tensor of the link probe's samples (fastt.adapters.probe)
KNEE_POINTS = 2  # probed sizes past a knee, at least
KNEE_GAIN = 1 / 3  # the least share of the line's summed relative error a hinge must remove


def _r2(y: np.ndarray, predicted: np.ndarray) -> float:
    """Coefficient of determination of the predictions on (x, y)."""
    ss = float(((y - y.mean()) ** 2).sum())
    res = float(((y - predicted) ** 2).sum())
    return 1.0 - res / ss if ss > 0 else 1.0


@dataclass(frozen=True, slots=True)
class LinkFit:
    """``seconds = intercept + slope * bytes + extra * max(bytes - knee, 0)`` for one pair,
    with its quality of fit (no knee: ``knee`` infinite, ``extra`` 0)."""
    slope: float  # seconds per byte
    intercept: float  # seconds
    r2: float
    samples: int
    knee: float = math.inf  # bytes
    extra: float = 0.0  # seconds per byte past the knee

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return 1.0 / self.slope if self.slope > 0 else float("inf")

    def predict(self, nbytes: float) -> float:
        return max(transfer_seconds(self.intercept, self.slope, self.knee, self.extra, nbytes),
                   0.0)


def transfer_seconds(intercept: float, slope: float, knee: float, extra: float,
                     nbytes: float) -> float:
    """A link's time for ``nbytes``: its line, plus ``extra`` per byte past ``knee``."""
    t = intercept + slope * nbytes
    return t + extra * (nbytes - knee) if nbytes > knee else t


def _median_fit(x: np.ndarray, y: np.ndarray, knee: float | None = None
                ) -> tuple[float, float, float, float]:
    """The median line on relative errors (with ``knee``, the hinge), as (intercept, slope,
    extra, summed relative error)."""
    from sklearn.linear_model import QuantileRegressor
    scale = float(np.abs(x).max()) or 1.0
    features = x[:, None] / scale
    if knee is not None:
        features = np.column_stack([features[:, 0], np.maximum(x - knee, 0.0) / scale])
    w = 1.0 / np.maximum(y, 1e-9)
    reg = QuantileRegressor(quantile=0.5, alpha=0.0, solver="highs").fit(features, y,
                                                                        sample_weight=w)
    coef = [float(c) / scale for c in reg.coef_]
    error = float((np.abs(y - reg.predict(features)) * w).sum())
    return float(reg.intercept_), coef[0], (coef[1] if knee is not None else 0.0), error


def _probed_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """(intercept, slope, knee, extra) of probed points: the median line on relative errors
    (small sizes set the latency, large ones the bandwidth, and one odd point moves neither),
    or the hinge on it that fits best where it removes ``KNEE_GAIN`` of the line's error, with
    ``KNEE_POINTS`` sizes past its knee and the line's bandwidth below it."""
    intercept, slope, _, error = _median_fit(x, y)
    best = (intercept, slope, math.inf, 0.0)
    sizes = np.unique(x)
    for knee in sizes[3:len(sizes) - KNEE_POINTS]:  # 4 sizes at least up to the knee
        i, s, extra, e = _median_fit(x, y, float(knee))
        if extra > 0 and s > 0 and e <= (1 - KNEE_GAIN) * error:
            error, best = e, (i, s, float(knee), extra)
    return best


class CommCostModel:
    """Per-pair linear regressions of transfer time on bytes; 0 within one device.

    A pair with too few samples (or all of one size) borrows the reverse pair's fit, else the
    mean fit of all known pairs, else costs ``default`` (0: FastT's 'unknown -> explore' rule).
    """

    def __init__(self, max_samples_per_pair: int = 2000, min_samples: int = 2) -> None:
        self.max_samples_per_pair = max_samples_per_pair
        self.min_samples = min_samples
        self._samples: dict[Pair, deque[tuple[float, float]]] = {}  # traced transfers
        self._probed: dict[Pair, deque[tuple[float, float]]] = {}
        self._fits: dict[Pair, LinkFit] = {}
        self._dirty: set[Pair] = set()
        self._cpu: dict[Pair, tuple[float, float]] = {}
        self._cpu_s: dict[Pair, tuple[float, float]] = {}

    def update(self, samples: Iterable[TransferSample]) -> None:
        for s in samples:
            self.add_sample(s.src, s.dst, s.nbytes, s.seconds, probed=s.tensor == PROBED)

    def add_sample(self, src: str, dst: str, nbytes: float, seconds: float,
                   probed: bool = False) -> None:
        pair = (devices.canonical(src), devices.canonical(dst))
        if pair[0] == pair[1]:
            return
        kept = self._probed if probed else self._samples
        q = kept.get(pair)
        if q is None:
            q = kept[pair] = deque(maxlen=self.max_samples_per_pair)
        q.append((float(nbytes), float(seconds)))
        self._dirty.add(pair)

    def _refit(self) -> None:
        # deferred: scikit-learn takes a second to import, and the scheduler, which imports
        # this module, fits no link itself
        from sklearn.linear_model import QuantileRegressor
        for pair in self._dirty:
            probed = list(self._probed.get(pair, ()))
            traced = [] if probed and any(self.cpu_share(*pair)) else \
                list(self._samples.get(pair, ()))
            data = np.asarray(traced + probed, dtype=np.float64)
            x, y = data[:, :1], data[:, 1]
            if len(data) < self.min_samples or np.ptp(x) == 0:
                self._fits.pop(pair, None)
                continue
            knee, extra = math.inf, 0.0
            if traced:
                scale = float(np.abs(x).max()) or 1.0  # bytes in units of the largest
                reg = QuantileRegressor(quantile=QUANTILE, alpha=0.0, solver="highs").fit(
                    x / scale, y)
                slope, intercept = float(reg.coef_[0]) / scale, float(reg.intercept_)
            else:
                intercept, slope, knee, extra = _probed_fit(x[:, 0], y)
            predicted = np.array([transfer_seconds(intercept, slope, knee, extra, b)
                                  for b in x[:, 0]])
            self._fits[pair] = LinkFit(slope, intercept, _r2(y, predicted),
                                       len(data), knee, extra)
        self._dirty.clear()

    def fit(self, src: str, dst: str) -> LinkFit | None:
        """The pair's own regression, or None when it has too few samples."""
        self._refit()
        return self._fits.get((devices.canonical(src), devices.canonical(dst)))

    def fits(self) -> dict[Pair, LinkFit]:
        self._refit()
        return dict(self._fits)

    def probed(self, src: str, dst: str) -> bool:
        """Whether the ``src -> dst`` link was probed (not only seen in traced steps)."""
        return (devices.canonical(src), devices.canonical(dst)) in self._probed

    def pairs(self) -> set[Pair]:
        return set(self._samples) | set(self._probed)

    def link(self, src: str, dst: str) -> LinkFit | None:
        """The fit used for the pair: its own, the reverse pair's, the mean of the pairs of
        its ``link_class`` (devices of one process: one probed pair stands for all), or the
        mean of all."""
        self._refit()
        src, dst = devices.canonical(src), devices.canonical(dst)
        own = self._fits.get((src, dst)) or self._fits.get((dst, src))
        if own is not None or not self._fits:
            return own
        kind = devices.link_class(src, dst)
        fits = [f for (a, b), f in self._fits.items()
                if kind is not None and devices.link_class(a, b) == kind] or \
            list(self._fits.values())
        knees = [f.knee for f in fits if f.extra > 0]
        return LinkFit(sum(f.slope for f in fits) / len(fits),
                       sum(f.intercept for f in fits) / len(fits),
                       min(f.r2 for f in fits), 0,
                       sum(knees) / len(knees) if knees else math.inf,
                       sum(f.extra for f in fits) / len(fits))

    def set_cpu_share(self, src: str, dst: str, send: float, recv: float,
                      send_s: float = 0.0, recv_s: float = 0.0) -> None:
        """The share of a ``src -> dst`` transfer's time that the sender's and the receiver's
        compute spend on it, and the seconds each spends on a transfer in a burst (``send_s``,
        ``recv_s``), measured by the link probe (``fastt.adapters.probe``)."""
        for v in (send, recv):
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"a CPU share is between 0 and 1, got {v}")
        for v in (send_s, recv_s):
            if not v >= 0.0:
                raise ValueError(f"a transfer's CPU seconds are 0 or more, got {v}")
        pair = (devices.canonical(src), devices.canonical(dst))
        self._cpu[pair] = (float(send), float(recv))
        self._cpu_s[pair] = (float(send_s), float(recv_s))
        self._dirty |= {pair, pair[::-1]} & self.pairs()  # which samples fit a pair may change

    def _by_roles(self, kept: dict[Pair, tuple[float, float]], src: str, dst: str
                  ) -> tuple[float, float]:
        # the reverse direction's when only it was measured: the roles, not the devices, set
        # what the ends spend
        src, dst = devices.canonical(src), devices.canonical(dst)
        return kept.get((src, dst)) or kept.get((dst, src)) or (0.0, 0.0)

    def cpu_share(self, src: str, dst: str) -> tuple[float, float]:
        """(sender, receiver) share of a transfer's time on their compute."""
        return self._by_roles(self._cpu, src, dst)

    def burst_cpu(self, src: str, dst: str) -> tuple[float, float]:
        """(sender, receiver) seconds of compute a transfer's call takes in a burst, beyond
        its share of the bytes' time (0: unmeasured, or devices of one process)."""
        return self._by_roles(self._cpu_s, src, dst)

    def background(self, src: str, dst: str, nbytes: float, seconds: float
                   ) -> tuple[float, float]:
        """(sender, receiver) share of their cores that a transfer of ``nbytes`` traced over
        ``seconds`` took, as the simulator charges it: its share of the bytes' modeled time
        and its call's seconds, spread over the time it was traced (never more than the
        share). A transfer traced slower than its link moves bytes no faster, and the cores
        do no more work for it: charging the share over the whole traced time would take
        that work from the kernels beside it again and again."""
        shares = self.cpu_share(src, dst)
        fit = self.link(src, dst)
        if fit is None or seconds <= 0 or not any(shares):
            return shares
        copy = max(fit.predict(nbytes) - fit.intercept, 0.0)
        calls = self.burst_cpu(src, dst)
        return (min(shares[0], (shares[0] * copy + calls[0]) / seconds),
                min(shares[1], (shares[1] * copy + calls[1]) / seconds))

    def cost(self, nbytes: float, src: str, dst: str, default: float = 0.0) -> float:
        """Predicted seconds to move ``nbytes`` from ``src`` to ``dst``."""
        if src == dst or devices.canonical(src) == devices.canonical(dst):
            return 0.0
        fit = self.link(src, dst)
        return default if fit is None else fit.predict(nbytes)

    def to_dict(self) -> dict[str, Any]:
        return {"max_samples_per_pair": self.max_samples_per_pair,
                "min_samples": self.min_samples,
                "pairs": [{"src": s, "dst": d,
                           "samples": [list(p) for p in self._samples.get((s, d), ())],
                           "probed": [list(p) for p in self._probed.get((s, d), ())]}
                          for (s, d) in sorted(self.pairs())],
                "fits": [{"src": s, "dst": d, "slope_s_per_byte": f.slope,
                          "intercept_s": f.intercept, "r2": f.r2, "samples": f.samples,
                          "knee_bytes": f.knee if f.extra > 0 else None,
                          "extra_s_per_byte": f.extra}
                         for (s, d), f in self.fits().items()],
                "cpu_share": [{"src": s, "dst": d, "send": a, "recv": b,
                               "send_s": self._cpu_s[(s, d)][0],
                               "recv_s": self._cpu_s[(s, d)][1]}
                              for (s, d), (a, b) in self._cpu.items()]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CommCostModel":
        model = cls(int(data.get("max_samples_per_pair", 2000)), int(data.get("min_samples", 2)))
        for entry in data.get("pairs", []):
            for key, probed in (("samples", False), ("probed", True)):
                for nbytes, seconds in entry.get(key, []):
                    model.add_sample(entry["src"], entry["dst"], nbytes, seconds, probed)
        for entry in data.get("cpu_share", []):
            model.set_cpu_share(entry["src"], entry["dst"], entry["send"], entry["recv"],
                                entry.get("send_s", 0.0), entry.get("recv_s", 0.0))
        return model
