"""What each training step costs fastt's budget, as the ``Controller`` runs them (no
TensorFlow here): the kind of each step (traced, on trial, run beside a plan being computed)
and the step time it is measured against; the costs learned on the way (``Budget.learn``); the
fixed costs a round and a trial are expected to take; when a trial must end; what waits until
the run pays for it (``Gate``)."""
from __future__ import annotations

import logging
from typing import Callable

from fastt.plugin.budget import Budget

log = logging.getLogger("fastt")


class Charges:
    """The step-by-step accounting of one session's ``Budget``."""

    def __init__(self, budget: Budget, dumps: bool = False) -> None:
        self.budget, self.dumps = budget, dumps  # dumps: each decision writes one
        self.role: tuple[str, float] | None = None  # the last step's: (kind, reference s)
        self.first_on_graph = False  # the next step is the first on a new graph
        self.read_s = 0.0  # what reading the last traced step's profile took
        self.plan_cost = 0.0  # what the steps run while the plan is computed lost
        self.trial_ended = False  # a trial ended after the last step ran
        self.ran = 0.0  # the last step's own run time (to its end: no loop time after it)

    def ran_step(self, kind: str | None, reference_s: float | None, ran_s: float) -> None:
        """A step of ``kind`` (``traced``, ``trials``, ``planning``; None: not charged) just
        ran for ``ran_s`` on a graph measured against ``reference_s``: charged when the next
        one starts (``step_started``), with the time the script's loop took around it."""
        self.role = (kind, reference_s) if kind and reference_s else None
        self.ran = ran_s

    def step_started(self, last_s: float | None) -> None:
        """A step starts; ``last_s``: the one before it, from start to start."""
        if self.role is not None and last_s is not None:
            self._charge(*self.role, last_s)
        self.role = None
        if self.trial_ended:  # its last step charged to it
            self.budget.end_trial()
            self.trial_ended = False

    def _charge(self, kind: str, reference_s: float, step_s: float) -> None:
        b = self.budget
        if self.first_on_graph and kind == "trials":
            b.learn("first_step", step_s - reference_s)
        self.first_on_graph = False
        if kind == "trials":
            b.trial_step(step_s, reference_s)
        elif kind == "traced":
            b.charge("traced", step_s - reference_s)
            b.learn("trace", step_s - reference_s + self.read_s)
        else:
            b.charge(kind, step_s - reference_s)
            self.plan_cost += max(0.0, step_s - reference_s)

    def round_need(self, profile_steps: int, step_s: float) -> float:
        """What a round (a profile, a plan, a trial and a return) is expected to cost."""
        b = self.budget
        return (profile_steps * b.estimate("trace", step_s) + b.estimate("prepare")
                + b.estimate("plan") + self.trial_need())

    def trial_need(self) -> float:
        """A trial's fixed costs: a strategy kept is activated three times (on trial, the
        graph before measured again, kept), each time with a first step on a new graph; with
        dumps on, its decision and the strategy it supersedes are written."""
        b = self.budget
        return 3 * (b.estimate("activate") + b.estimate("first_step")) + \
            (2 * b.estimate("record") if self.dumps else 0.0)

    def trial_over(self) -> bool:
        """Whether the trial running must end: with the step that just ran (its loss is
        charged when the next one starts), one more like it and a return to the graph
        before, it would take fastt past its budget."""
        last = max(0.0, self.ran - self.role[1]) if self.role is not None else 0.0
        return self.budget.over(self.budget.estimate("activate") + last, last)

    def stop_reason(self, steps: int) -> str:
        """Why a trial ends before its verdict: fastt's budget."""
        b = self.budget
        return (f"stopped {steps} steps into its trial at fastt's overhead budget "
                f"({b.describe()}): {b.trial:.2f} s lost on it so far, {b.spent:.2f} s of "
                f"{b.allowed():.2f} s spent")


class Gate:
    """What waits for the run to pay for it: ``go`` runs once the budget affords ``need()``
    more seconds of fastt's work (the ``Controller`` is in its ``waiting`` phase till then)."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.what = ""  # what waits ("" when nothing)
        self._then: tuple[Callable[[], float], Callable[[], None]] = (float, lambda: None)

    def admit(self, what: str, need: Callable[[], float], go: Callable[[], None]) -> bool:
        """``go`` now if the run pays for ``need()`` (True); else ``what`` waits, said once
        (False)."""
        b, seconds = self.budget, need()
        if b.affords(seconds):
            self.what = ""
            go()
            return True
        if self.what != what:
            when = b.when(seconds)
            log.info("fastt: %s would cost about %.1f s more of fastt's work, past its budget "
                     "(%s: %.1f s so far of %.1f s allowed); %s", what, seconds, b.describe(),
                     b.spent, b.allowed(), "it waits until the session has run about "
                     f"{when:.0f} s" if when is not None else "it is not tried")
        self.what, self._then = what, (need, go)
        return False

    def poll(self) -> None:
        """What waits goes, once the run pays for it."""
        need, go = self._then
        if self.budget.affords(need()):
            log.debug("fastt: the run pays for %s now", self.what)
            self.what = ""
            go()
