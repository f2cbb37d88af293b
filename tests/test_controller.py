"""The plugin's decisions, with a fake backend: no TensorFlow, no sessions."""
import logging
import os
from dataclasses import dataclass, field

import pytest

from fastt.plugin.controller import Controller
from fastt.plugin.settings import Settings


@dataclass
class FakeStrategy:
    name: str
    predicted_step_time_s: float
    devices: list = field(default_factory=lambda: ["a", "b"])


class FakeBackend:
    """Step times per running strategy; records what the controller asked for."""

    def __init__(self, times, predicted=None, change=0.5, fail_on=None):
        self.times = times  # strategy name (None: original) -> seconds per step
        self.predicted = predicted or {}
        self.change = change
        self.fail_on = fail_on
        self.running = None
        self.activations, self.plans, self.profiles, self.records = [], [], 0, []
        self.timelines = []

    def starting_strategy(self):
        return "data-parallel"

    def profile(self, meta):
        assert meta == "trace"
        self.profiles += 1

    def cost_change(self):
        return self.change

    def plan(self, name):
        if self.fail_on == "plan":
            raise RuntimeError("planner broke")
        self.plans.append(name)
        return FakeStrategy(name, self.predicted.get(name, 0.001))

    def predict(self, strategy):
        return self.predicted.get(strategy.name, 0.001)

    def activate(self, strategy):
        if self.fail_on == "activate" and strategy is not None:
            raise RuntimeError("activation broke")
        self.running = strategy
        self.activations.append(None if strategy is None else strategy.name)

    def record(self, entry, history):
        self.records.append((entry.n, entry.status))
        self.timelines.append(entry.timeline)
        return f"dump/strategy-{entry.n}"

    def step_time(self):
        return self.times[None if self.running is None else self.running.name]


def drive(ctl, backend, steps):
    for _ in range(steps):
        trace = ctl.before_step()
        ctl.after_step(backend.step_time(), "trace" if trace else None)


SETTINGS = Settings(enabled=True, warmup_steps=3, profile_steps=2, measure_steps=3,
                    max_rounds=3, reprofile_every=10)


def test_faster_strategies_are_kept_and_superseded():
    b = FakeBackend({None: 0.010, "data-parallel": 0.008, "os-dpos": 0.006},
                    predicted={"data-parallel": 0.008, "os-dpos": 0.006})
    ctl = Controller(SETTINGS, b)
    drive(ctl, b, 3)
    assert ctl.phase == "profile" and ctl.original_s == [0.010, 0.010]
    drive(ctl, b, 2)  # profiled, planned the starting strategy, activated it
    assert b.plans == ["data-parallel"] and b.activations == ["data-parallel"]
    drive(ctl, b, 3 + 2)  # measured (kept), profiled, planned os-dpos
    assert b.plans == ["data-parallel", "os-dpos"] and b.activations[-1] == "os-dpos"
    drive(ctl, b, 3)
    assert [e.status for e in ctl.history] == ["superseded", "active"]
    assert ctl.active.name == "os-dpos" and b.running.name == "os-dpos"
    assert ctl.history[1].measured_s == [0.006, 0.006]


def test_a_slower_strategy_is_rolled_back_to_the_one_before(caplog):
    b = FakeBackend({None: 0.010, "data-parallel": 0.020, "os-dpos": 0.009},
                    predicted={"data-parallel": 0.005, "os-dpos": 0.004})
    ctl = Controller(SETTINGS, b)
    with caplog.at_level(logging.INFO, logger="fastt"):
        drive(ctl, b, 3 + 2 + 3)
    assert ctl.history[0].status == "rolled_back" and "slower than the original" in \
        ctl.history[0].reason
    assert b.running is None and b.activations == ["data-parallel", None]
    assert any("rolled back strategy 1 (data-parallel)" in r.message and "speedup 0.50x" in
               r.message for r in caplog.records)
    drive(ctl, b, 2 + 3)  # os-dpos is planned from the original graph and kept
    assert ctl.history[1].status == "active" and b.running.name == "os-dpos"


def test_no_activation_when_the_plan_is_not_predicted_faster():
    b = FakeBackend({None: 0.010, "data-parallel": 0.008, "os-dpos": 0.007},
                    predicted={"data-parallel": 0.004, "os-dpos": 0.005})
    ctl = Controller(SETTINGS, b)
    drive(ctl, b, 3 + 2 + 3 + 2)
    assert b.plans == ["data-parallel", "os-dpos"] and b.activations == ["data-parallel"]
    assert len(ctl.history) == 1


def test_stable_cost_models_end_planning_then_periodic_reprofiling():
    b = FakeBackend({None: 0.010, "data-parallel": 0.008, "os-dpos": 0.006},
                    predicted={"data-parallel": 0.008, "os-dpos": 0.006}, change=0.01)
    ctl = Controller(SETTINGS, b)
    drive(ctl, b, 3 + 2 + 3 + 2 + 3)  # the chosen strategy is planned once in any case
    assert b.plans == ["data-parallel", "os-dpos"]
    drive(ctl, b, 2)  # profiled again: stable -> steady
    assert ctl.phase == "steady" and b.plans == ["data-parallel", "os-dpos"]
    profiles = b.profiles
    drive(ctl, b, 10)
    assert ctl.phase == "profile"
    drive(ctl, b, 2)  # small change: no re-plan
    assert b.profiles == profiles + 2 and b.plans == ["data-parallel", "os-dpos"]
    b.change = 0.5
    drive(ctl, b, 10 + 2)  # a significant change: re-planned
    assert b.plans[-1] == "os-dpos" and len(b.plans) == 3


@pytest.mark.parametrize("where", ["plan", "activate"])
def test_a_failure_returns_to_the_original_graph_with_one_warning(where, caplog):
    b = FakeBackend({None: 0.010, "data-parallel": 0.008}, fail_on=where)
    ctl = Controller(SETTINGS, b)
    with caplog.at_level(logging.WARNING, logger="fastt"):
        drive(ctl, b, 3 + 2 + 20)
    assert b.running is None and ctl.phase == "off"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "broke" in warnings[0].message
    if where == "activate":
        assert ctl.history[0].status == "failed" and b.records[-1] == (1, "failed")


def test_strict_mode_raises():
    b = FakeBackend({None: 0.010}, fail_on="plan")
    ctl = Controller(Settings(enabled=True, warmup_steps=2, profile_steps=1, strict=True), b)
    with pytest.raises(RuntimeError, match="planner broke"):
        drive(ctl, b, 3)


def test_with_dumps_one_measured_step_is_traced_and_left_out_of_the_timings():
    b = FakeBackend({None: 0.010, "data-parallel": 0.008})
    ctl = Controller(Settings(enabled=True, warmup_steps=3, profile_steps=2, measure_steps=3,
                              max_rounds=1, dump_dir="dumps"), b)
    drive(ctl, b, 3 + 2)  # warmed up, profiled, activated
    assert ctl.phase == "measure" and not ctl.before_step()  # the first step: not traced
    ctl.after_step(0.5)  # it builds the executors: excluded
    assert ctl.before_step()  # the second step is traced...
    ctl.after_step(0.9, "trace")  # ...(a traced step is slow) and not timed
    assert not ctl.before_step()
    drive(ctl, b, 2)
    entry = ctl.history[0]
    assert b.timelines == ["trace"] and entry.measured_s == [0.008, 0.008]
    assert entry.status == "active" and b.profiles == 2
    assert entry.timeline is None  # written with the dump, not kept
    assert ctl.session == f"{os.getpid()}-{ctl.session.split('-')[1]}"  # names its dumps
    plain = Controller(SETTINGS, FakeBackend({None: 0.010, "data-parallel": 0.008}))
    drive(plain, plain.backend, 3 + 2)
    traced = []
    while plain.phase == "measure":  # without dumps: no measured step is traced
        traced.append(plain.before_step())
        plain.after_step(0.008)
    assert traced == [False] * 3 and plain.backend.timelines == [None]
    assert Controller(SETTINGS, plain.backend).session != plain.session
