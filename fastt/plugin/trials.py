"""The keep rule of the session plugin's ``Controller`` (no TensorFlow here): a strategy on
trial is measured against the graph before it, found faster or not by ``fastt.plugin.measure``,
measured again after it when found faster (A-B-A: a machine drifting between the two samples
cannot make it look faster), then kept or rolled back; a kept plan's own order is tried
against TensorFlow's. Stopped at fastt's overhead budget (``fastt.plugin.charges``)."""
from __future__ import annotations

import logging
import os
import statistics
from typing import Any, Callable

from fastt.plugin import messages as say
from fastt.plugin.budget import Budget
from fastt.plugin.charges import Charges
from fastt.plugin.entry import Entry, Sample
from fastt.plugin.measure import CONFIDENCE, compare
from fastt.plugin.protocols import Backend
from fastt.plugin.settings import Settings
from fastt.plugin.window import Window

log = logging.getLogger("fastt")

EXTEND = 3  # an undecided comparison measures up to EXTEND * measure steps more
RESTARTS = 2  # times a measurement starts again after the machine's load changed
LOOKS = 1 + EXTEND  # comparisons one measurement may make: each at 1 - (1 - CONFIDENCE) / LOOKS


class Trials:
    """The trial phases (``measure``, ``recheck``) of a ``Controller``, whose state they
    share."""
    settings: Settings
    backend: Backend
    budget: Budget
    charges: Charges
    history: list[Entry]
    active: Entry | None
    original: Sample | None
    original_s: list[float]
    phase: str
    step: int
    rounds: int
    _win: Window
    _measuring: Entry | None
    _rechecking: Entry | None
    _fifo_next: Entry | None
    _restarts: int
    _activate: Callable[[Entry | None], None]
    _record: Callable[[Entry], str]
    _next_round: Callable[[], None]

    @property
    def original_median_s(self) -> float | None:
        return statistics.median(self.original_s) if self.original_s else None

    def _try_fifo(self, kept: Entry) -> None:
        """The plan just kept, with TensorFlow's own order instead of the planned one: the
        order is enforced only where it measures faster."""
        self._fifo_next = None
        self._measure_entry(Entry(len(self.history) + 1, kept.name, kept.strategy,
                                  self.backend.predict(kept.strategy, fifo=True),
                                  step=self.step, ordered=False))

    def _measure_entry(self, entry: Entry) -> None:
        self.history.append(entry)
        self._measuring = entry
        self._activate(entry)
        self.phase, self._restarts = "measure", 0
        self._win.reset(self.step)

    def _measure(self, run_metadata: Any) -> None:
        if run_metadata is not None and self._measuring is not None:
            self._measuring.timeline = run_metadata
            return
        entry = self._measuring
        assert entry is not None
        previous = self.active
        if self.charges.trial_over():
            self._measuring = None
            entry.measured_s = list(self._win.times)
            entry.baseline = say.label(previous)
            entry.reason = self.charges.stop_reason(self.step - self._win.start_step)
            self._conclude(entry, previous, False, on_it=True)
            return
        sample = self._win.sample()
        if sample is None:
            return
        base = previous.sample if previous is not None else self.original
        assert base is not None
        verdict = compare(base.times, sample.times, seed=entry.n,
                          load_change=sample.load_change(base), base_load=base.load,
                          cores=os.cpu_count(),
                          confidence=1 - (1 - CONFIDENCE) / LOOKS)
        if verdict.verdict == "load changed" and self._restarts < RESTARTS:
            self._restarts += 1
            log.debug("fastt: %s; measuring strategy %d again", verdict.reason, entry.n)
            self._win.reset(self.step)
            return
        self._win.looks += 1
        if verdict.verdict == "undecided" and self._win.looks < LOOKS:
            self._win.next_look = len(self._win.times) + self.settings.measure_steps
            return  # more steps
        self._measuring = None
        entry.sample, entry.verdict, entry.measured_s = sample, verdict, sample.times
        self.backend.calibrate(entry.strategy, entry.ordered, statistics.median(sample.times))
        entry.baseline = say.label(previous)
        if verdict.verdict == "undecided" and previous is not None and previous.ordered and \
                not entry.ordered and entry.strategy is previous.strategy:
            # the planned order, measured no faster than TensorFlow's own within the noise,
            # does not pay for enforcing it (control dependencies, the priority executor)
            entry.reason = ("not significantly slower than the same plan in its planned order: "
                            "an order is enforced only where it measures faster")
            self._conclude(entry, previous, True, on_it=True)
            return
        if verdict.verdict == "faster" and self.settings.rollback and \
                not self._original_misfit(previous):
            # A-B-A: the graph before runs once more, so that the machine drifting between
            # the two samples (steps that keep getting faster, other load) cannot make the
            # candidate look faster (not an original kept off the devices by their memory:
            # the plan is kept either way)
            self._rechecking = entry
            self._activate(previous)
            self.phase, self._restarts = "recheck", 0
            self._win.reset(self.step)
            return
        self._conclude(entry, previous, verdict.verdict == "faster", on_it=True)

    def _recheck(self, _: Any) -> None:
        entry = self._rechecking
        assert entry is not None and entry.sample is not None
        if self.charges.trial_over():
            # the graph before is the slower one so far: the strategy found faster stays
            self._rechecking = None
            entry.reason = self.charges.stop_reason(self.step - self._win.start_step) + \
                f" measuring {entry.baseline} again; kept on its own measurement"
            self._conclude(entry, self.active, True, on_it=False)
            return
        again = self._win.sample()
        if again is None:
            return
        verdict = compare(again.times, entry.sample.times, seed=entry.n,
                          load_change=entry.sample.load_change(again), base_load=again.load,
                          cores=os.cpu_count())
        if verdict.verdict == "load changed" and self._restarts < RESTARTS:
            self._restarts += 1
            self._win.reset(self.step)
            return
        self._rechecking = None
        previous = self.active
        if previous is None:  # the fresher measurement is the baseline from now on
            self.original, self.original_s = again, again.times
        else:
            previous.sample, previous.measured_s = again, again.times
        self.backend.calibrate(previous.strategy if previous else None,
                               previous.ordered if previous else True,
                               statistics.median(again.times))
        entry.recheck, entry.recheck_sample = verdict, again
        # Found faster before, and its interval still below 1 against the graph before it
        # measured again: a machine whose load moved in between does not undo that (the
        # recheck is there for steps that drift faster, which would make the graph before
        # look faster the second time, not slower).
        faster = verdict.verdict == "faster" or (verdict.verdict == "load changed" and
                                                 verdict.high < 1.0)
        if not faster:
            entry.reason = (f"faster than {entry.baseline} measured before it, but not than "
                            f"{entry.baseline} measured again after it ("
                            f"{say.why_not(entry, previous, verdict)})")
        self._conclude(entry, previous, faster, on_it=False)

    def _conclude(self, entry: Entry, previous: Entry | None, faster: bool, on_it: bool
                  ) -> None:
        """Keep ``entry`` or roll it back (``on_it``: whether it is the graph running)."""
        self.charges.trial_ended = True
        entry.decided_at = self.step
        if not faster and entry.verdict is not None and not entry.reason:
            entry.reason = say.why_not(entry, previous, entry.verdict)
        misfit = "" if faster else self._original_misfit(previous)
        if not faster and self.settings.rollback and not misfit:
            entry.status = "rolled_back"
            if on_it:
                self._activate(previous)
        else:
            if misfit:  # the devices' memory, as the user set it, rules the original out
                entry.reason += f"; kept: {misfit}"
            elif not faster:
                entry.reason += "; kept (FASTT_ROLLBACK=0)"
            if not on_it:
                self._activate(entry)
            entry.status = "active"
            if previous is not None:
                previous.status = "superseded"
                previous.dump = self._record(previous)
            self.active = entry
            if entry.cached:  # its order was chosen when it was kept; no round to come
                self.rounds = self.settings.max_rounds
            elif entry.ordered and self.settings.order:
                self._fifo_next = entry
        entry.dump = self._record(entry)
        entry.timeline = None  # in its dump now; a RunMetadata can be large
        log.info(say.decided(entry, self.original_median_s))
        self._next_round()

    def _original_misfit(self, previous: Entry | None) -> str:
        """Why the graph a candidate is compared with cannot be returned to: the original graph
        (``previous`` None) does not fit its device's memory as set ("" otherwise)."""
        return self.backend.original_misfit() if previous is None else ""
