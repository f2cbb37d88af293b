"""How a ``Controller``'s session ends (no TensorFlow here): the plan kept stored for the next
run, a strategy still on trial recorded as unfinished, and the closing line."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

from fastt.plugin import messages as say
from fastt.plugin.budget import Budget
from fastt.plugin.entry import Entry
from fastt.plugin.protocols import Backend
from fastt.plugin.settings import Settings
from fastt.plugin.window import Window
from fastt.sched.search.memory_fit import FITTED

log = logging.getLogger("fastt")


class Closing:
    """``close`` of a ``Controller``, whose state it shares."""
    settings: Settings
    backend: Backend
    budget: Budget
    history: list[Entry]
    active: Entry | None
    phase: str
    step: int
    _win: Window
    _measuring: Entry | None
    _rechecking: Entry | None
    _passed: list[str]
    _record: Callable[[Entry], str]

    if TYPE_CHECKING:  # the Controller's
        @property
        def running(self) -> Entry | None: ...

        @property
        def original_median_s(self) -> float | None: ...

    def close(self) -> None:
        """The session closes: a strategy still measured, or found faster and waiting for the
        graph before it to be measured again, is recorded as unfinished, with how far it got
        (its record is not lost); then the closing line."""
        entry = self._measuring or self._rechecking
        running = self.running  # the graph the session ends on
        kept = self.active if self.active is not None and self.active.status == "active" \
            else None
        fitted = kept is not None and kept.name == FITTED  # fitted anew at each first step
        if not fitted and (kept is not None or
                           (self.phase == "steady" and (self.history or self._passed))):
            # for the next run: the plan kept, or that none measured faster than the original
            self.backend.store(kept, dict(self.budget.seen))
        if entry is not None:
            self._measuring = self._rechecking = None
            entry.status = "unfinished"
            entry.reason = say.unfinished(entry, self.step - self._win.start_step, self.active)
            entry.dump = self._record(entry)
            entry.timeline = None
            log.info(say.left_unfinished(entry))
        if self.history or self._passed or \
                self.phase in ("warmup", "waiting", "profile", "planning"):
            self.log_closing(running)

    def log_closing(self, running: Entry | None = None) -> None:
        """The line a session logs when it closes (``running``: the strategy it ended on,
        when not the one kept)."""
        log.debug("fastt: its own cost in full: %s", self.budget.as_dict())
        if self.phase == "warmup":  # too short a session to measure the original graph
            log.info(say.closed_in_warmup(
                self.step, self._win.times, self.settings.measure_steps,
                self.settings.measure_seconds if self._win.reads_load else 0.0)
                + "; " + say.cost(self.budget))
        else:
            log.info(say.closed(self.step, running or self.active, self.original_median_s,
                                len(self.history), self.settings.dump_dir,
                                dumped=any(e.dump for e in self.history),
                                passed=len(self._passed))
                     + "; " + say.cost(self.budget))
