"""fastt's own cost on the user's run, and whether the run can pay for what fastt wants to try
next (no TensorFlow here).

At wall time ``t`` since the training step was found, fastt may have spent at most
``fraction * t + fixed_s`` (``FASTT_OVERHEAD``, default 3% + 2 s). Spent counts:

- ``own``: fastt's work on the training thread between two steps (reading profiles, planning
  there, probing links, activating strategies);
- ``traced``: a traced step's time beyond the untraced step of the graph that ran it;
- ``planning``: steps run while a plan is computed off the training thread, beyond the
  graph's step (they share the machine with the planner);
- ``trials``: the steps of a strategy on trial beyond the graph it is compared with, net over
  the trial and never below 0 (a faster trial costs nothing), the first step on its new graph
  included; and the graph before it measured again after a strategy found faster, beyond that
  strategy's step.

Before a round (a profile, a plan and a trial), a re-profile or a trial of a plan's other
order, the controller asks ``affords``: what was spent, plus the estimate of what comes
(the largest cost of each kind seen so far in this session, or a prior before the first),
must fit in the budget now. A run too short to pay for a round never starts one; a long run
starts as soon as it can (3% of 70 s pays for a 2 s round beyond the fixed 2 s). A trial whose
losses would take the spent amount past the budget, less a return to the graph before it, ends
there, rolled back.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

# Estimates before the session saw one of its own (seconds; a traced step: per step, plus a
# multiple of the untraced step; ``prepare``: what a plan needs from TensorFlow on the training
# thread, the first time probing the links; ``record``: writing a dump, with its report): the
# corpus' small graphs took 0.3-0.6 s to activate on 2 CPU devices, probing 2 devices of one
# process about 1 s, and a dump about 1 s.
PRIORS = {"trace": 0.02, "activate": 0.5, "first_step": 0.2, "plan": 0.1, "prepare": 1.0,
          "record": 1.0}
LAST = ("prepare",)  # kinds whose next cost is the last one's (the first probes the links)
TRACE_FACTOR = 2.0  # a traced step's extra, in its untraced steps, before one was seen
KINDS = ("own", "traced", "planning", "trials")


@dataclass
class Budget:
    """What fastt spent on one session (``spent``, by kind), against ``allowed``."""
    fraction: float = 0.03
    fixed_s: float = 2.0
    clock: Callable[[], float] = field(default=lambda: 0.0, repr=False)
    start: float | None = None  # the clock when the session's training step was found
    by_kind: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    seen: dict[str, float] = field(default_factory=dict)  # the largest cost of each kind
    trial: float = 0.0  # the running trial's net loss so far (may be negative)

    @property
    def on(self) -> bool:
        return math.isfinite(self.fraction) and math.isfinite(self.fixed_s)

    def begin(self) -> None:
        if self.start is None:
            self.start = self.clock()

    def elapsed(self) -> float:
        return 0.0 if self.start is None else self.clock() - self.start

    def allowed(self) -> float:
        """The most fastt may have spent by now."""
        return self.fraction * self.elapsed() + self.fixed_s if self.on else math.inf

    @property
    def spent(self) -> float:
        return sum(self.by_kind.values()) + max(0.0, self.trial)

    def charge(self, kind: str, seconds: float) -> None:
        self.by_kind[kind] += max(0.0, seconds)

    def learn(self, kind: str, seconds: float) -> None:
        """One more observed cost of ``kind`` (``PRIORS``' keys): estimates keep the largest
        (the last one for ``LAST``)."""
        seconds = max(0.0, seconds)
        self.seen[kind] = seconds if kind in LAST else max(self.seen.get(kind, 0.0), seconds)

    def estimate(self, kind: str, step_s: float = 0.0) -> float:
        if kind in self.seen:
            return self.seen[kind]
        return PRIORS[kind] + (TRACE_FACTOR * step_s if kind == "trace" else 0.0)

    # -- a trial's running loss ------------------------------------------------------------
    def trial_step(self, step_s: float, reference_s: float) -> None:
        self.trial += step_s - reference_s

    def end_trial(self) -> None:
        self.by_kind["trials"] += max(0.0, self.trial)
        self.trial = 0.0

    # -- decisions --------------------------------------------------------------------------
    def affords(self, need_s: float) -> bool:
        return self.spent + need_s <= self.allowed()

    def over(self, reserve_s: float, pending_s: float = 0.0) -> bool:
        """Whether a running trial must end: it lost time (``pending_s`` more in a step not
        charged yet) and the spent amount, with ``reserve_s`` to return to the graph before
        it, passed the budget."""
        return self.trial + pending_s > 0.0 and \
            self.spent + pending_s + reserve_s > self.allowed()

    def when(self, need_s: float) -> float | None:
        """The session's age (seconds) at which ``need_s`` more fits (None: never)."""
        if not self.on or self.fraction <= 0.0:
            return None if self.spent + need_s > self.allowed() else self.elapsed()
        return max(self.elapsed(), (self.spent + need_s - self.fixed_s) / self.fraction)

    def describe(self) -> str:
        """``FASTT_OVERHEAD``'s value in words, as the lines say it."""
        if not self.on:
            return "no limit (FASTT_OVERHEAD=off)"
        return f"{100 * self.fraction:g}% of the run + {self.fixed_s:g} s"

    def as_dict(self) -> dict[str, Any]:
        return {"spent_s": round(self.spent, 4), "allowed_s": round(self.allowed(), 4)
                if self.on else None, "session_s": round(self.elapsed(), 4),
                "budget": self.describe(),
                "by_kind_s": {k: round(v + (max(0.0, self.trial) if k == "trials" else 0.0), 4)
                              for k, v in self.by_kind.items()},
                "estimates_s": {k: round(v, 4) for k, v in self.seen.items()}}


def parse(raw: str) -> tuple[float, float]:
    """``FASTT_OVERHEAD``: ``P%+Ss`` (a share of the run plus seconds), ``P%``, ``Ss``, or
    ``off``; returns (fraction, seconds), both infinite for ``off``. Raises ``ValueError``."""
    text = raw.strip().lower().replace(" ", "")
    if text in ("off", "none", "inf"):
        return math.inf, math.inf
    fraction, seconds = 0.0, 0.0
    parts = [p for p in text.split("+")]
    if not text or len(parts) > 2 or not all(parts):
        raise ValueError(raw)
    kinds = set()
    for p in parts:
        if p.endswith("%"):
            kinds.add("%")
            fraction = float(p[:-1]) / 100
        elif p.endswith("s"):
            kinds.add("s")
            seconds = float(p[:-1])
        else:
            raise ValueError(raw)
    if len(kinds) != len(parts) or not (0 <= fraction < 1) or not 0 <= seconds < math.inf:
        raise ValueError(raw)
    return fraction, seconds
