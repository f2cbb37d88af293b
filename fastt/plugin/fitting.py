"""The ``Controller``'s answer to a training step that would not fit its device's memory as it
is (no TensorFlow here): from its first step it runs as the backend fits it, gradient
accumulation over micro-batches on the device (``Engine.fitted``), and fastt plans nothing more
in the session. When nothing fits, the step runs as it is, and TensorFlow says what it could
not allocate. A fitted step that runs out of memory all the same at its first step is fitted
again into a smaller share (``refit``), and run again from the state before it."""
from __future__ import annotations

import logging
from typing import Callable

from fastt.errors import FasttError
from fastt.plugin import messages as say
from fastt.plugin.budget import Budget
from fastt.plugin.entry import Entry
from fastt.plugin.protocols import Backend
from fastt.sched.search.memory_fit import FITTED

log = logging.getLogger("fastt")

REFIT_SHARE = 0.7  # of the bytes the last fit planned the step for, the next one plans for
REFITS = 3  # fits again after running out of memory, at most


class Fitting:
    """``fit_memory`` of a ``Controller``, whose state it shares."""
    backend: Backend
    budget: Budget
    _clock: Callable[[], float]
    history: list[Entry]
    active: Entry | None
    phase: str
    step: int
    _activate: Callable[[Entry | None], None]
    _record: Callable[[Entry], str]

    _fit: tuple[float, int] = (0.0, 0)  # (the bytes the last fit planned the step for, refits)

    def fit_memory(self, limit: float, why: str) -> None:
        """The training step would not fit the ``limit`` bytes TensorFlow lets it hold
        (``why``): its fitted graph runs from the step about to start, kept for the session."""
        self.phase = "off"
        began = self._clock()
        self._fit = (self.backend.fit_budget(limit), 0)
        try:
            strategy = self.backend.fitted(self._fit[0])
        except FasttError as e:
            log.warning("fastt: %s, and nothing fastt can run fits: %s; the step runs as it "
                        "is", why, e)
            self.budget.charge("own", self._clock() - began)
            return
        entry = Entry(len(self.history) + 1, FITTED, strategy,
                      strategy.predicted_step_time_s, status="active", step=self.step,
                      ordered=False, reason=f"{why}: {strategy.note}", decided_at=self.step)
        self.history.append(entry)
        self.active = entry
        self._run_fitted(entry, began)
        log.info("fastt: %s; it runs with %s, and fastt plans nothing more in this session",
                 why, strategy.note)

    def refit(self, error: BaseException) -> bool:
        """The fitted step failed at its first step with ``error``: when it ran out of memory,
        fitted again into ``REFIT_SHARE`` of the memory planned for (up to ``REFITS`` times);
        whether that graph now runs (the failed step then runs again on it, from the state
        before it)."""
        entry, (budget, refits) = self.active, self._fit
        if entry is None or entry.name != FITTED or refits >= REFITS or \
                type(error).__name__ != "ResourceExhaustedError":
            return False
        self._fit = (REFIT_SHARE * budget, refits + 1)
        began = self._clock()
        try:
            strategy = self.backend.fitted(self._fit[0])
        except FasttError as e:
            log.warning("fastt: %s ran out of memory, and nothing smaller fits (%s)",
                        say.label(entry), e)
            self.budget.charge("own", self._clock() - began)
            return False
        entry.strategy, entry.reason = strategy, f"{entry.reason}; refitted: {strategy.note}"
        self._run_fitted(entry, began)
        log.info("fastt: %s ran out of memory at its first step; it runs again as %s",
                 say.label(entry), strategy.note)
        return True

    def _run_fitted(self, entry: Entry, began: float) -> None:
        """``entry``'s graph runs, its dump written; the fit's time since ``began`` charged
        to fastt's own cost."""
        self._activate(entry)
        entry.dump = self._record(entry)
        self.budget.charge("own", self._clock() - began)
