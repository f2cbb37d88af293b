"""What the session plugin records of each strategy it tried: its measured sample and the
verdicts on it (dumped per strategy; see ``fastt.plugin.session_dumps``). No TensorFlow here."""
from __future__ import annotations

import itertools
import os
import statistics
from dataclasses import dataclass, field
from typing import Any

from fastt.plugin.measure import Verdict

_sessions = itertools.count(1)


def session_id() -> str:
    """A new session's name in dumps: ``<pid>-<k>``."""
    return f"{os.getpid()}-{next(_sessions)}"


@dataclass
class Sample:
    """The step times of one graph after its warm-up: the time from the start of one training
    step to the start of the next, as the script's own throughput sees it."""
    times: list[float]
    warmup: int  # steps left out as warm-up (MSER-5), or up to the cap when never settled
    settled: bool
    load: float | None  # other processes' load while it ran, in cores (None: not known)

    def load_change(self, before: "Sample") -> float:
        """How far the other load moved since ``before`` was taken, in cores (0: unknown)."""
        return self.load - before.load if self.load is not None and before.load is not None \
            else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"warmup_steps": self.warmup, "settled": self.settled,
                "other_load_cores": self.load, "steps": len(self.times)}


@dataclass
class Entry:
    """One strategy fastt computed, with what happened to it."""
    n: int
    name: str
    strategy: Any
    predicted_s: float
    status: str = "measuring"
    step: int = 0  # training step at which it was activated
    measured_s: list[float] = field(default_factory=list)
    reason: str = ""
    dump: str = ""
    timeline: Any = None  # the RunMetadata of one traced step on it (with dumps on)
    sample: Sample | None = None
    verdict: Verdict | None = None  # against the graph it was compared with
    baseline: str = ""  # that graph: "the original graph" or "strategy <n> (<name>)"
    ordered: bool = True  # False: the same plan with TensorFlow's own FIFO order
    # against the graph it was compared with, measured again after it (found faster only)
    recheck: Verdict | None = None
    recheck_sample: Sample | None = None
    cached: bool = False  # from the plan cache: kept by an earlier run, not planned here
    error: str = ""  # the whole error it failed with (its reason says it in one line)
    decided_at: int | None = None  # the training step at which it was kept or rolled back

    @property
    def measured_median_s(self) -> float | None:
        return statistics.median(self.measured_s) if self.measured_s else None

    def decision(self) -> dict[str, Any] | None:
        """What its measurement concluded, for the dump (None before it is measured)."""
        if self.verdict is None or self.sample is None:
            return None
        again = None if self.recheck is None or self.recheck_sample is None else \
            {**self.recheck.as_dict(), "steps": len(self.recheck_sample.times)}
        return {"baseline": self.baseline, **self.verdict.as_dict(), **self.sample.as_dict(),
                "recheck": again}
