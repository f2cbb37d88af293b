"""The session plugin's decisions, step by step (no TensorFlow here).

A ``Controller`` sees every run of the training step: ``before_step()`` says whether to trace
it, ``step_started()`` times it (``fastt.plugin.window``), ``after_step(run_metadata)``
records it and, between two steps, profiles, plans, activates, measures and rolls back
through a ``Backend`` (the TensorFlow side). The phases:

    warmup -> profile -> planning -> measure -> recheck -> (rolled back | active)
           -> profile -> ... -> steady
    steady -> (every ``reprofile_every`` steps, or more where a round would take over 1% of
               the steps in between) profile -> plan only on a significant change
    steady -> (devices lost before are back: ``Backend.returned``) profile -> plan
    (a lost device recovered from: ``recovered``) rebase -> steady

A round, a trial or a re-profile starts only when the run pays for it (``waiting`` until it
does: ``fastt.plugin.budget``); a plan not computed within ``plan_wait_s`` is waited for
(``planning``) while the steps go on; a plan an earlier run kept (``Backend.cached``) is
measured after the warm-up instead of the first round.

The first plan is the starting strategy (data parallel when the model fits one device, else a
model-parallel spread), the next ones the chosen strategy; planning stops when the cost models
are stable or after ``max_rounds``. A strategy is activated only when it is predicted faster
than the one running (under an overhead budget the original graph too: without one, every
plan is tried), and rolled back when it measures slower than the one before it, but
never to an original graph that does not fit its device's memory as the user set it
(``FASTT_DEVICE_MEMORY_MB``): a plan that fits is kept then, and the reason recorded.
"""
from __future__ import annotations

import logging
import math
import statistics
import time
from typing import Any, Callable

from fastt.errors import WorkerLostError
from fastt.plugin import messages as say
from fastt.plugin.budget import Budget
from fastt.plugin.charges import Charges, Gate
from fastt.plugin.entry import Entry, Sample, session_id
from fastt.plugin.fitting import Fitting
from fastt.plugin.recovery import Recovered, Recovering
from fastt.plugin.closing import Closing
from fastt.plugin.protocols import Backend, Done, Pending
from fastt.plugin.trials import Trials
from fastt.sched import registry
from fastt.plugin.settings import Settings
from fastt.plugin.window import Window

log = logging.getLogger("fastt")

REPROFILE_SHARE = 0.01  # of the steady steps' time a periodic re-profile may take, at most


class Controller(Trials, Fitting, Recovering, Closing):
    def __init__(self, settings: Settings, backend: Backend, session: str = "",
                 clock: Callable[[], float] = time.perf_counter,
                 run_plan: Callable[[Callable[[], Any]], Pending] = Done) -> None:
        self.settings, self.backend, self._clock = settings, backend, clock
        self.budget = Budget(settings.overhead_fraction, settings.overhead_s, clock)
        self.charges = Charges(self.budget, dumps=bool(settings.dump_dir))
        self._run_plan = run_plan  # where plans are computed (the plugin: off the thread)
        self._pending: tuple[str, Pending, float] | None = None  # (name, plan, began)
        self._gate = Gate(self.budget)  # what waits for the run to pay for it
        self.session = session or session_id()  # names it in strategy dumps
        self.phase = "warmup"
        self.step = 0
        self.rounds = 0
        self.history: list[Entry] = []
        self.active: Entry | None = None  # None: the original graph
        self._running: Entry | None = None  # whose graph runs (None: the original)
        self.original_s: list[float] = []
        self.original: Sample | None = None
        self._win = Window(settings, clock)  # the graph being measured: its step times
        self._restarts = 0  # of the current measurement, after the load changed
        self._traced = 0
        self._measuring: Entry | None = None
        self._since_profile = 0
        self._reprofile_every = settings.reprofile_every  # stretched where a round costs more
        self._reprofile_began: tuple[float, int] | None = None  # (clock, step) of this round
        self._chosen_planned = False  # stability ends planning once the chosen one ran
        self._settled = False  # the cost models were found stable once
        self._returned = False  # devices lost before are back: the re-profile plans
        self._passed: list[str] = []  # plans not tried: predicted no faster than the running
        self._fifo_next: Entry | None = None  # kept with its order: measure it without
        self._rechecking: Entry | None = None  # found faster: its baseline runs once more
        self._phases: dict[str, Callable[[Any], None]] = {
            "warmup": self._warmup, "profile": self._profile, "measure": self._measure,
            "recheck": self._recheck, "steady": self._steady, "off": self._off,
            "planning": self._planning, "waiting": self._wait, "rebase": self._rebase}

    # -- what the runtime calls around each training step ---------------------------------
    def before_step(self) -> bool:
        """Whether the coming step is traced: profiling, and with dumps on, the second step
        of a measurement (its timeline, left out of the timings)."""
        return self.phase == "profile" or (self.phase == "measure" and self._timeline_due())

    def _timeline_due(self) -> bool:
        m = self._measuring
        return bool(self.settings.dump_dir) and m is not None and m.timeline is None \
            and len(self._win.times) == 1

    def step_started(self) -> None:
        """A training step starts: the time since the last one started, less what fastt's own
        ``after_step`` took, is a step time of the graph being measured, unless fastt worked
        in between (traced, planned, activated): ``Window.step_started``. The step before
        is charged to fastt's budget as its kind says (``fastt.plugin.budget``)."""
        self.budget.begin()
        self._win.step_started()
        self.charges.step_started(self._win.last)

    def _role_of(self, phase: str, traced: bool) -> tuple[str | None, float | None]:
        """How the step that just ran counts against the budget (None: it does not), and the
        step time it is measured against."""
        if traced:
            return "traced", self._reference()
        if phase == "recheck" and self._rechecking is not None and \
                self._rechecking.sample is not None:
            return "trials", statistics.median(self._rechecking.sample.times)
        kind = {"measure": "trials", "planning": "planning"}.get(phase)
        return kind, self._reference()

    @property
    def running(self) -> Entry | None:
        """The strategy whose graph the steps run on (None: the original graph)."""
        return self._measuring or self.active

    def _reference(self) -> float | None:
        """The step time of the graph kept so far (the original's before one is kept)."""
        if self.active is not None and self.active.measured_s:
            return self.active.measured_median_s
        return self.original_median_s

    def after_step(self, run_metadata: Any = None) -> None:
        began = self._clock()
        self.step += 1
        phase = self.phase
        self.charges.ran_step(*self._role_of(phase, run_metadata is not None),
                              began - self._win.started if self._win.started is not None
                              else 0.0)
        try:
            self._phases[phase](run_metadata)
        except WorkerLostError:
            raise  # no graph can run on a broken cluster
        except Recovered:
            pass  # training went on without a lost server: the recovered graph runs
        except Exception as e:  # noqa: BLE001 - never break training
            if not self.backend.survive(e):
                self.fail(e)
        except KeyboardInterrupt as e:  # the user's: it reaches the script, fastt stops
            # in a known state (the script may go on to save its work)
            self.fail(e)
            raise
        # a snapshot for recovery (``fastt.plugin.elastic``): out of the step's time, and a
        # cost of its own, not of fastt's trials
        if self.phase != phase:
            log.debug("fastt: %s phase from step %d", self.phase, self.step + 1)
        kept = self.backend.step_ended()
        self._win.clean = run_metadata is None and \
            self.phase == phase in ("warmup", "measure", "recheck", "rebase")
        self._win.own = self._clock() - began
        self.budget.charge("own", self._win.own - kept)

    def fail(self, error: BaseException) -> None:
        """Something inside fastt failed: back to the original graph, stop planning (a server
        of the cluster lost: ``WorkerLostError`` naming it, from ``Backend.lost``)."""
        self.backend.lost(error)
        if self.settings.strict:
            raise error
        failed = self.running  # the strategy that failed, if one did
        running = self._running  # None: the original graph runs already
        phase = self.phase
        reason = say.failure(error) if str(error) else \
            f"{type(error).__name__} while fastt was in its {phase} phase"
        log.debug("fastt: the failure in full: %r", error)
        if self._rechecking is not None:  # found faster, never kept
            self._rechecking.status, self._rechecking.reason = "failed", reason
            self._rechecking.dump = self._record(self._rechecking)
        self.phase, self._measuring, self.active, self._rechecking = "off", None, None, None
        self._pending = None
        self.charges.trial_ended = True
        on = "the original graph"
        if running is not None:
            try:
                self._activate(None)
            except WorkerLostError:
                raise
            except Exception as e:  # noqa: BLE001 - the graph running keeps the state
                on = (f"{say.label(running)}: could not return to the original graph "
                      f"({say.failure(e)})")
        for entry in [failed] + ([running] if running is not failed else []):
            if entry is None:
                continue
            entry.status, entry.reason = "failed", reason
            entry.error = f"{type(error).__name__}: {error}"
            entry.dump = self._record(entry)
        what = f"{say.label(failed)} failed: " if failed is not None else ""
        log.warning("fastt: %s%s; training continues on %s, and fastt plans nothing more in "
                    "this session", what, reason, on)

    def stop(self, why: str) -> None:
        """fastt steps aside for this session (``why``), back on the original graph: what
        was measured is recorded as unfinished, a strategy kept as rolled back; no more
        planning."""
        for entry, status in ((self._measuring or self._rechecking, "unfinished"),
                              (self.active, "rolled_back")):
            if entry is not None:
                entry.status, entry.reason = status, why
                entry.dump = self._record(entry)
        self.phase, self._measuring, self._rechecking, self.active = "off", None, None, None
        self._running, self._pending = None, None
        self.charges.trial_ended = True

    # -- phases --------------------------------------------------------------------------
    def _warmup(self, _: Any) -> None:
        sample = self._win.sample()
        if sample is None:
            return
        self.original, self.original_s = sample, sample.times
        hit = self.backend.cached()
        if hit is None:
            self._when_paid("a first round", self._round_need, self._start_profile)
            return
        strategy, costs = hit  # a plan kept by an earlier run: checked, not planned
        for kind, seconds in costs.items():
            self.budget.learn(kind, seconds)
        if strategy is None:  # the earlier run kept the original graph: nothing to try
            self.phase = "off"
            return
        entry = Entry(1, strategy.name, strategy, strategy.predicted_step_time_s,
                      step=self.step, ordered=getattr(strategy, "ordered", True), cached=True)
        self._when_paid("a trial of the cached plan", self.charges.trial_need,
                        lambda: self._measure_entry(entry))

    # -- the budget --------------------------------------------------------------------------
    def _round_need(self) -> float:
        return self.charges.round_need(self.settings.profile_steps, self._reference() or 0.0)

    def _when_paid(self, what: str, need: Callable[[], float], go: Callable[[], None]
                   ) -> None:
        """``go`` now if the run pays for ``need()`` more seconds of fastt's work, else once it
        does (phase ``waiting``, said once)."""
        if not self._gate.admit(what, need, go):
            self.phase = "waiting"

    def _wait(self, _: Any) -> None:
        self._gate.poll()

    def _profile(self, run_metadata: Any) -> None:
        if run_metadata is None:  # not traced: another session's step was
            return
        mine = self.active.measured_median_s if self.active is not None else None
        began = self._clock()
        self.backend.profile(run_metadata, mine or self.original_median_s)
        self.charges.read_s = self._clock() - began
        self._traced += 1
        if self._traced < self.settings.profile_steps:
            return
        if self._chosen_planned and not self._returned and \
                self.backend.cost_change() < self.settings.replan_threshold:
            # said once; a periodic re-profile that changes nothing stays quiet
            log.log(logging.DEBUG if self._settled else logging.INFO,
                    "fastt: cost models stable (change %.1f%%); keeping %s",
                    100 * self.backend.cost_change(), say.label(self.active))
            self._settled = True
            if self._reprofile_began is not None:
                self._stretch_reprofiles(*self._reprofile_began)
                self._reprofile_began = None
            self._steady_now()
            return
        self._plan_round()

    def _stretch_reprofiles(self, began: float, at_step: int) -> None:
        """The periodic re-profile that began at ``began`` (clock) after ``at_step`` ended:
        the next one comes late enough that its cost beyond its steps' own time stays within
        ``REPROFILE_SHARE`` of the steady steps in between (a round cost 11-43 ms beyond its
        steps on the throughput scripts' MLP and CNN, 0.5-1% of 500 of their steps; a
        larger graph's traced steps and profile cost more)."""
        step_s = (self.active.measured_median_s if self.active else None) or \
            self.original_median_s
        if not step_s:
            return
        took = self._clock() - began - (self.step - at_step) * step_s
        self._reprofile_every = max(self.settings.reprofile_every,
                                    math.ceil(took / (REPROFILE_SHARE * step_s)))
        log.debug("fastt: a re-profile took %.0f ms beyond its steps; the next in %d steps",
                  1e3 * took, self._reprofile_every)

    def _plan_round(self) -> None:
        self.rounds += 1
        self._returned = False
        self._reprofile_began = None  # a round that plans measures: not a re-profile's cost
        # a strategy that may start from the data-parallel graph tries that graph first
        first = not self.history and not self._passed and \
            registry.kind(self.settings.strategy).starts == "both"
        name = self.backend.starting_strategy() if first else self.settings.strategy
        began = self._clock()
        self.backend.prepare_plan()  # on this thread: what planning needs from TensorFlow
        prepared = self._clock()
        self.budget.learn("prepare", prepared - began)
        self.charges.plan_cost = 0.0
        pending = self._run_plan(lambda: self.backend.plan(name))
        self._pending = (name, pending, self._clock() - prepared)
        self.phase = "planning"
        # a plan that comes within ``plan_wait_s`` is used at once, as if computed here; a
        # longer one is waited for while the training steps go on
        pending.wait(self.settings.plan_wait_s)
        self._planning(None)

    def _planning(self, _: Any) -> None:
        """The plan being computed, once done: measured if predicted faster than the graph
        kept."""
        assert self._pending is not None
        name, pending, on_thread = self._pending
        if not pending.done():
            return
        self._pending = None
        self.budget.learn("plan", on_thread + self.charges.plan_cost)
        strategy = pending.result()
        self._chosen_planned = self._chosen_planned or name == self.settings.strategy
        current = self._predicted_running()
        if current is not None and current <= strategy.predicted_step_time_s:
            log.info("fastt: %s predicts %.2f ms, no better than %s (%.2f ms); keeping it",
                     name, 1e3 * strategy.predicted_step_time_s, say.label(self.active),
                     1e3 * current)
            self._passed.append(name)
            if self.active is None and name != self.settings.strategy:
                self._plan_round()  # the profile just read serves the chosen strategy too
            else:
                self._next_round()
            return
        # a plan predicted faster in TensorFlow's own order runs in it from the start
        entry = Entry(len(self.history) + 1, name, strategy, strategy.predicted_step_time_s,
                      step=self.step, ordered=getattr(strategy, "ordered", True))
        self._when_paid(f"a trial of {name}", self.charges.trial_need,
                        lambda: self._measure_entry(entry))

    def _predicted_running(self) -> float | None:
        """The step time predicted for the graph running, which a plan must beat to be
        tried: the active strategy's; the original graph's under an overhead budget (a
        trial predicted to lose costs the run with nothing to gain; without a budget every
        plan is tried), unless it does not fit its device's memory. None: no bar."""
        if self.active is not None:
            return self.backend.predict(self.active.strategy, fifo=not self.active.ordered)
        if not self.budget.on or self.backend.original_misfit():
            return None
        return self.backend.predict_original()

    def _record(self, entry: Entry) -> str:
        """``entry``'s dump written (or refreshed); its path. What it took is learned: a
        trial's decision writes one or two."""
        began = self._clock()
        path = self.backend.record(entry, self.history)
        self.budget.learn("record", self._clock() - began)
        return path

    def _activate(self, entry: Entry | None) -> None:
        """Run ``entry``'s graph (None: the original)."""
        began = self._clock()
        self.backend.activate(entry.strategy if entry else None,
                              ordered=entry.ordered if entry else True)
        self._running = entry
        self.budget.learn("activate", self._clock() - began)
        self.charges.first_on_graph = True

    def _steady(self, _: Any) -> None:
        self._since_profile += 1
        if self.backend.returned():  # a profile of the graph running, then a plan with them
            self._returned = True
            self._start_profile()
        elif self.settings.reprofile_every and self._since_profile >= self._reprofile_every \
                and self.budget.affords(self.settings.profile_steps * self.budget.estimate(
                    "trace", self._reference() or 0.0)):
            self.rounds = max(self.rounds, 1)  # re-plans only on a significant change
            self._reprofile_began = (self._clock(), self.step)
            self._start_profile()

    def _off(self, _: Any) -> None:
        pass

    # -- helpers -------------------------------------------------------------------------
    def _next_round(self) -> None:
        if self._fifo_next is not None:  # no profile needed: the plan is the same
            kept = self._fifo_next
            self._when_paid("a trial of TensorFlow's own order", self.charges.trial_need,
                            lambda: self._try_fifo(kept))
        elif self.rounds >= self.settings.max_rounds:
            self._steady_now()
        else:
            self._when_paid("another round", self._round_need, self._start_profile)

    def _start_profile(self) -> None:
        self.phase, self._traced = "profile", 0

    def _steady_now(self) -> None:
        self.phase, self._since_profile = "steady", 0
        self.rounds = self.settings.max_rounds
