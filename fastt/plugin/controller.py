"""The session plugin's decisions, step by step (no TensorFlow here).

A ``Controller`` sees every run of the training step: ``before_step()`` says whether to trace
it, ``after_step(seconds, run_metadata)`` records it and, between two steps, profiles, plans,
activates, measures and rolls back through a ``Backend`` (the TensorFlow side). The phases:

    warmup -> profile -> plan -> measure -> (rolled back | active) -> profile -> ... -> steady
    steady -> (every ``reprofile_every`` steps) profile -> plan only on a significant change

The first plan is the starting strategy (data parallel when the model fits one device, else a
model-parallel spread), the next ones the chosen strategy; planning stops when the cost models
are stable or after ``max_rounds``. A strategy is activated only when it is predicted faster
than the one running, and rolled back when it measures slower than the one before it.
"""
from __future__ import annotations

import itertools
import logging
import os
import statistics
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastt.errors import WorkerLostError
from fastt.ir import Graph, writes_variable
from fastt.plugin.settings import Settings

log = logging.getLogger("fastt")

STATUSES = ("measuring", "active", "superseded", "rolled_back", "failed")
_sessions = itertools.count(1)


_PLAIN_ASSIGNS = frozenset({"Assign", "AssignVariableOp"})


def updates_trainables(graph: Graph, names: list[str], trainable: set[str]) -> bool:
    """Whether running ``names`` updates a trainable variable (any variable when
    ``trainable`` is empty): what makes a run a training step. An update reads what it
    changes (an optimizer's apply, an add, a scatter, or an assign of a value computed from
    variables); an initializer or a restore assigns a value from elsewhere and is not one."""
    step = graph.fan_in(names)
    for op in step:
        if not (writes_variable(op) and op.inputs) or \
                (trainable and op.inputs[0].op not in trainable):
            continue
        if op.type not in _PLAIN_ASSIGNS or len(op.inputs) < 2:
            return True
        if any(o.is_variable for o in step.fan_in([op.inputs[1].op])):
            return True
    return False


class Backend(Protocol):
    def starting_strategy(self) -> str: ...
    def profile(self, run_metadata: Any) -> None: ...
    def cost_change(self) -> float: ...
    def plan(self, name: str) -> Any: ...
    def predict(self, strategy: Any) -> float: ...
    def activate(self, strategy: Any | None) -> None: ...
    def record(self, entry: "Entry", history: list["Entry"]) -> str: ...


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

    @property
    def measured_median_s(self) -> float | None:
        return statistics.median(self.measured_s) if self.measured_s else None


def session_id() -> str:
    """A new session's name in dumps: ``<pid>-<k>``."""
    return f"{os.getpid()}-{next(_sessions)}"


class Controller:
    def __init__(self, settings: Settings, backend: Backend, session: str = "") -> None:
        self.settings, self.backend = settings, backend
        self.session = session or session_id()  # names it in strategy dumps
        self.phase = "warmup"
        self.step = 0
        self.rounds = 0
        self.history: list[Entry] = []
        self.active: Entry | None = None  # None: the original graph
        self.original_s: list[float] = []
        self._times: list[float] = []
        self._traced = 0
        self._measuring: Entry | None = None
        self._since_profile = 0
        self._chosen_planned = False  # stability ends planning once the chosen one ran
        self._settled = False  # the cost models were found stable once

    # -- what the runtime calls around each training step ---------------------------------
    def before_step(self) -> bool:
        """Whether the coming step is traced: profiling, and with dumps on, the second step
        of a measurement (its timeline, left out of the timings)."""
        return self.phase == "profile" or (self.phase == "measure" and self._timeline_due())

    def _timeline_due(self) -> bool:
        m = self._measuring
        return bool(self.settings.dump_dir) and m is not None and m.timeline is None \
            and len(self._times) == 1

    def after_step(self, seconds: float, run_metadata: Any = None) -> None:
        self.step += 1
        try:
            getattr(self, "_" + self.phase)(seconds, run_metadata)
        except WorkerLostError:
            raise  # no graph can run on a broken cluster
        except Exception as e:  # noqa: BLE001 - never break training
            self.fail(e)

    def fail(self, error: BaseException) -> None:
        """Something inside fastt failed: back to the original graph, stop planning."""
        if self.settings.strict:
            raise error
        running = self._measuring or self.active  # None: the original graph runs already
        reason = f"{type(error).__name__}: {error}"
        log.warning("fastt: %s; training continues on the original graph", reason)
        self.phase, self._measuring, self.active = "off", None, None
        if running is None:
            return
        running.status, running.reason = "failed", reason
        try:
            self.backend.activate(None)
        except WorkerLostError:
            raise
        except Exception as e:  # noqa: BLE001
            log.error("fastt: could not return to the original graph (%s: %s)",
                      type(e).__name__, e)
        running.dump = self.backend.record(running, self.history)

    # -- phases --------------------------------------------------------------------------
    def _warmup(self, seconds: float, _: Any) -> None:
        self._times.append(seconds)
        if len(self._times) >= self.settings.warmup_steps:
            self.original_s = self._times[1:]  # the first step builds the executors
            self._start_profile()

    def _profile(self, seconds: float, run_metadata: Any) -> None:
        if run_metadata is not None:
            self.backend.profile(run_metadata)
        self._traced += 1
        if self._traced < self.settings.profile_steps:
            return
        if self._chosen_planned and self.backend.cost_change() < self.settings.replan_threshold:
            # said once; a periodic re-profile that changes nothing stays quiet
            log.log(logging.DEBUG if self._settled else logging.INFO,
                    "fastt: cost models stable (change %.1f%%); keeping %s",
                    100 * self.backend.cost_change(), self._label(self.active))
            self._settled = True
            self._steady_now()
            return
        self._plan_round()

    def _plan_round(self) -> None:
        self.rounds += 1
        first = not self.history and self.settings.strategy in ("os-dpos", "dpos")
        name = self.backend.starting_strategy() if first else self.settings.strategy
        strategy = self.backend.plan(name)
        self._chosen_planned = self._chosen_planned or name == self.settings.strategy
        if self.active is not None:
            current = self.backend.predict(self.active.strategy)
            if current <= strategy.predicted_step_time_s:
                log.info("fastt: %s predicts %.2f ms, no better than %s (%.2f ms); keeping it",
                         name, 1e3 * strategy.predicted_step_time_s, self._label(self.active),
                         1e3 * current)
                self._next_round()
                return
        entry = Entry(len(self.history) + 1, name, strategy, strategy.predicted_step_time_s,
                      step=self.step)
        self.history.append(entry)
        self._measuring = entry
        self.backend.activate(strategy)
        self.phase, self._times = "measure", []

    def _measure(self, seconds: float, run_metadata: Any) -> None:
        if run_metadata is not None and self._measuring is not None:
            self._measuring.timeline = run_metadata
            return
        self._times.append(seconds)
        if len(self._times) < self.settings.measure_steps:
            return
        entry, self._measuring = self._measuring, None
        assert entry is not None
        entry.measured_s = self._times[1:]
        previous = self.active
        before = previous.measured_median_s if previous else statistics.median(self.original_s)
        assert entry.measured_median_s is not None and before is not None
        if entry.measured_median_s > before and not self.settings.rollback:
            entry.reason = (f"measured {1e3 * entry.measured_median_s:.2f} ms/step, slower than "
                            f"{self._label(previous)} at {1e3 * before:.2f} ms/step; kept "
                            "(FASTT_ROLLBACK=0)")
        if entry.measured_median_s > before and self.settings.rollback:
            entry.status = "rolled_back"
            entry.reason = (f"measured {1e3 * entry.measured_median_s:.2f} ms/step, slower than "
                            f"{self._label(previous)} at {1e3 * before:.2f} ms/step")
            self.backend.activate(previous.strategy if previous else None)
        else:
            entry.status = "active"
            if previous is not None:
                previous.status = "superseded"
                previous.dump = self.backend.record(previous, self.history)
            self.active = entry
        entry.dump = self.backend.record(entry, self.history)
        entry.timeline = None  # in its dump now; a RunMetadata can be large
        self._summary(entry)
        self._next_round()

    def _steady(self, seconds: float, _: Any) -> None:
        self._since_profile += 1
        if self.settings.reprofile_every and self._since_profile >= self.settings.reprofile_every:
            self.rounds = max(self.rounds, 1)  # re-plans only on a significant change
            self._start_profile()

    def _off(self, seconds: float, _: Any) -> None:
        pass

    # -- helpers -------------------------------------------------------------------------
    def _next_round(self) -> None:
        if self.rounds >= self.settings.max_rounds:
            self._steady_now()
        else:
            self._start_profile()

    def _start_profile(self) -> None:
        self.phase, self._traced = "profile", 0

    def _steady_now(self) -> None:
        self.phase, self._since_profile = "steady", 0
        self.rounds = self.settings.max_rounds

    @property
    def original_median_s(self) -> float | None:
        return statistics.median(self.original_s) if self.original_s else None

    def speedup(self, e: Entry) -> float:
        orig, mine = self.original_median_s, e.measured_median_s
        return orig / mine if orig and mine else float("nan")

    def log_closing(self) -> None:
        """The line a session logs when it closes."""
        a, where = self.active, self.settings.dump_dir
        log.info("fastt: session closed after %d training steps on %s; %d strategies tried, "
                 "dumps%s", self.step, "the original graph" if a is None else
                 f"strategy {a.n} ({a.name}), {self.speedup(a):.2f}x over the original",
                 len(self.history), f" in {where}" if where else " off (set FASTT_DUMP_DIR)")

    @staticmethod
    def _label(entry: Entry | None) -> str:
        return "the original graph" if entry is None else f"strategy {entry.n} ({entry.name})"

    def _summary(self, e: Entry) -> None:
        orig = self.original_median_s
        measured = e.measured_median_s or 0.0
        speedup = self.speedup(e)
        verb = "activated" if e.status == "active" else "rolled back"
        log.info("fastt: %s strategy %d (%s) on %d devices: predicted %.2f ms/step, measured "
                 "%.2f ms/step, original %.2f ms/step, speedup %.2fx%s%s", verb, e.n, e.name,
                 len(getattr(e.strategy, "devices", [])), 1e3 * e.predicted_s, 1e3 * measured,
                 1e3 * (orig or 0.0), speedup, f" ({e.reason})" if e.reason else "",
                 f"; dump {e.dump}" if e.dump else "")
