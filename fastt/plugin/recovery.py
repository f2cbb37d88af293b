"""The ``Controller``'s side of a recovery from a lost device (no TensorFlow here): the
strategy the backend re-planned over the devices left runs from the failed step on, kept
for the session; what was on trial ends unfinished, the strategy that lost its device is
recorded as ``lost``, and the steps on the new graph are measured afresh (``rebase``), as the
baseline of the plans after it."""
from __future__ import annotations

from typing import Any, Callable

from fastt.plugin.charges import Charges
from fastt.plugin.entry import Entry
from fastt.plugin.window import Window


class Recovered(Exception):
    """fastt's own work (building a graph to try) was cut short by a recovery from a lost
    device: what it built was planned over the devices lost, and the graph recovered runs."""


class Recovering:
    """``recovered`` of a ``Controller``, whose state it shares."""
    history: list[Entry]
    active: Entry | None
    _running: Entry | None
    _measuring: Entry | None
    _rechecking: Entry | None
    _pending: Any
    _win: Window
    charges: Charges
    step: int
    phase: str
    _record: Callable[[Entry], str]
    _steady_now: Callable[[], None]

    def recovered(self, strategy: Any, what: str) -> Entry:
        """``strategy`` runs from now on, after the graph running lost a device (``what``
        says which, and how the state was brought back); its entry, recorded."""
        for entry, status in ((self._running, "lost"), (self._measuring, "unfinished"),
                              (self._rechecking, "unfinished")):
            if entry is not None and entry.status in ("measuring", "active"):
                entry.status, entry.reason = status, what
                entry.decided_at = self.step
                entry.dump = self._record(entry)
        entry = Entry(len(self.history) + 1, strategy.name, strategy,
                      strategy.predicted_step_time_s, status="active", step=self.step,
                      ordered=getattr(strategy, "ordered", True), reason=what,
                      decided_at=self.step)
        self.history.append(entry)
        self.active = self._running = entry
        self._measuring = self._rechecking = self._pending = None
        entry.dump = self._record(entry)
        self._win.reset(self.step)
        self.charges.first_on_graph = True
        self._steady_now()
        self.phase = "rebase"
        return entry

    def _rebase(self, _: Any) -> None:
        """The recovered graph measured, as the original is in warm-up: the baseline later
        plans are compared with; steady then."""
        sample = self._win.sample()
        if sample is None:
            return
        assert self.active is not None
        self.active.sample, self.active.measured_s = sample, sample.times
        self._steady_now()
