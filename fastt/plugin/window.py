"""The step times of the graph being measured, and when they make a sample (no TensorFlow
here)."""
from __future__ import annotations

from typing import Callable

from fastt.plugin.entry import Sample
from fastt.plugin.host_load import Reading, other_load
from fastt.plugin.measure import BATCH, steady_start
from fastt.plugin.settings import Settings


class Window:
    """The step-to-step times of the graph that runs, since it started being measured
    (``reset``), and the machine's other load since then where it can be read
    (``reads_load``: on Linux, outside a cluster; a cluster's workers are other processes,
    whose load is the graph's own), in which case each sample spans the time that takes."""

    def __init__(self, settings: Settings, clock: Callable[[], float]) -> None:
        self.settings, self._clock = settings, clock
        self.times: list[float] = []
        self.reading = Reading()  # when they started
        self.reads_load = settings.cluster is None and self.reading.busy is not None
        self.start_step = 0  # and at which training step
        self.looks, self.next_look = 0, 0  # comparisons made; steps the next one waits for
        self.started: float | None = None  # when the last step started
        self.own = 0.0  # seconds fastt's own work took after the last step ran
        self.clean = False  # whether the last step's time is the graph's alone
        self.last: float | None = None  # the last step's time, clean or not

    def reset(self, step: int) -> None:
        """Measure afresh from training step ``step``."""
        self.times, self.reading, self.start_step = [], Reading(), step
        self.looks, self.next_look = 0, 0

    def step_started(self) -> None:
        """A training step starts: the time since the last one started, less ``own``, is a
        step time of the graph (what the user's loop does between steps counts; fastt's
        bookkeeping does not), unless the last step was not ``clean`` (traced, or fastt
        planned or activated after it)."""
        now = self._clock()
        self.last = None if self.started is None else now - self.started - self.own
        if self.last is not None and self.clean:
            self.times.append(self.last)
        self.started = now

    def sample(self) -> Sample | None:
        """The graph's sample once its steps have settled and ``measure_steps`` followed, over
        at least ``measure_seconds`` where the machine's load is read (``fastt.plugin.host_load``
        cannot tell from a shorter window whether it moved); at the cap, the last ones,
        marked unsettled; None before, and between looks (one every ``BATCH`` steps until
        a comparison asks for more steps, then once ``next_look`` steps ran)."""
        times = self.times
        if len(times) < self.next_look or (not self.next_look and len(times) % BATCH):
            # MSER-5 reads whole batches, and a look costs milliseconds of Python; a longer
            # sample an undecided comparison asked for is looked at when due
            return None
        if self.reads_load and sum(times) < self.settings.measure_seconds:
            return None  # too short to tell whether the machine's load moved meanwhile
        found = steady_start(times, self.settings.warmup_steps, self.settings.measure_steps)
        if found is None:
            return None
        start, ok = found
        load = other_load(self.reading, Reading()) if self.reads_load else None
        return Sample(times[start:], start, ok, load)
