"""A fake ``Backend`` for the plugin's ``Controller`` on a synthetic clock, and the training loop
that drives it (no TensorFlow)."""
import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from fastt.plugin.controller import Controller


@dataclass
class FakeStrategy:
    name: str
    predicted_step_time_s: float
    devices: list = field(default_factory=lambda: ["a", "b"])
    ordered: bool = True
    note: str = ""


class FakeBackend:
    """Step times per running strategy (times a lognormal noise, ``noise`` its sigma, and a
    warm-up factor over the first steps of each graph); records what the controller asked
    for."""

    def __init__(self, times, predicted=None, change=0.5, fail_on=None, noise=0.0,
                 warmup=(), drift=None, misfit=""):
        self.times = times  # strategy name (None: original) -> seconds per step
        self.predicted = predicted or {}
        self.change = change
        self.fail_on = fail_on
        self.running, self.ordered = None, True
        self.activations, self.plans, self.profiles, self.records = [], [], 0, []
        self.timelines = []
        self.clock, self.noise, self.warmup, self.on_graph = 0.0, noise, list(warmup), 0
        self.traced = []  # per step: whether it was traced
        self.rng = np.random.default_rng(0)
        self.drift = drift  # clock -> factor on every step time (the machine drifting)
        self.planned_fifo: set[str] = set()  # "<name>/fifo": planned in TensorFlow's order
        self.misfit = misfit  # why the original graph does not fit its device ("" if it does)
        self.calibrations = []  # (strategy name, ordered, seconds) per calibration
        self.profile_s = 0.0  # seconds each traced step's profile takes
        self.activate_s = 0.0  # seconds an activation takes
        self.plan_s = 0.0  # seconds a plan takes (on the thread that computes it)
        self.hit = None  # what the plan cache holds: (strategy, costs) or None
        self.stored = []  # (kept strategy's name or None, costs) per store
        self.fits = []  # the limits ``fitted`` was asked for
        self.back = False  # devices lost before answer again (``returned``, once)

    def starting_strategy(self):
        return "data-parallel"

    def original_misfit(self):
        return self.misfit

    def fit_budget(self, limit):
        return limit - getattr(self, "held", 0.0)

    def fitted(self, limit):
        """A fit into ``limit`` bytes: the fewest of 2, 4, 8 micro-batches whose step holds
        ``need`` / m bytes (``need``: the original's, default 100 MiB), else DoesNotFit."""
        from fastt.errors import DoesNotFit
        self.fits.append(limit)
        need = getattr(self, "need", 100 * 2 ** 20)
        for m in (2, 4, 8):
            if need / m <= limit:
                return FakeStrategy("memory-fit", math.nan, devices=["a"], ordered=False,
                                    note=f"{m} micro-batches in turn")
        raise DoesNotFit(f"no gradient accumulation fits {limit / 2 ** 20:.1f} MiB")

    def profile(self, meta, untraced_s=None):
        assert meta == "trace"
        self.clock += self.profile_s  # the profile's own Python
        assert untraced_s is not None and untraced_s > 0  # the running graph was measured
        self.profiles += 1

    def calibrate(self, strategy, ordered, untraced_s):
        # a measurement is of the graph running, as it runs
        assert strategy is self.running and (strategy is None or ordered == self.ordered)
        self.calibrations.append((None if strategy is None else strategy.name, ordered,
                                  untraced_s))

    def cost_change(self):
        return self.change

    def prepare_plan(self):
        pass

    def plan(self, name):
        if self.fail_on == "plan":
            raise RuntimeError("planner broke")
        self.plans.append(name)
        self.clock += self.plan_s
        return FakeStrategy(name, self.predicted.get(name, 0.001),
                            ordered=name + "/fifo" not in self.planned_fifo)

    def predict(self, strategy, fifo=False):
        return self.predicted.get(strategy.name + ("/fifo" if fifo else ""), 0.001)

    def predict_original(self):
        return self.predicted.get(None, math.inf)  # unset: no plan is held to it

    def activate(self, strategy, ordered=True):
        if self.fail_on == "activate" and strategy is not None:
            raise RuntimeError("activation broke")
        self.clock += self.activate_s
        self.running, self.ordered = strategy, ordered
        self.on_graph = 0
        self.activations.append(None if strategy is None else strategy.name)

    def step_ended(self):
        return 0.0

    def returned(self):
        back, self.back = self.back, False
        return back

    def lost(self, error):
        pass

    def survive(self, error):
        return False

    def cached(self):
        return self.hit

    def store(self, entry, costs):
        self.stored.append((None if entry is None else entry.name, dict(costs)))

    def record(self, entry, history):
        self.records.append((entry.n, entry.status))
        self.timelines.append(entry.timeline)
        return f"dump/strategy-{entry.n}"

    def step_time(self):
        name = None if self.running is None else self.running.name
        t = self.times.get(f"{name}/fifo" if not self.ordered else name, self.times[name])
        if self.on_graph < len(self.warmup):
            t *= self.warmup[self.on_graph]
        self.on_graph += 1
        if self.drift is not None:
            t *= self.drift(self.clock)
        return t * (self.rng.lognormal(0.0, self.noise) if self.noise else 1.0)


def controller_of(settings, backend, budget=False, **kw):
    """A controller on the fake backend's clock: fastt's own work takes no time on it. Its
    overhead budget (``fastt.plugin.budget``) is off unless ``budget``: its estimates before a
    cost is seen are those of real graphs."""
    if not budget:
        settings = dataclasses.replace(settings, overhead_fraction=math.inf,
                                       overhead_s=math.inf)
    return Controller(settings, backend, clock=lambda: backend.clock, **kw)


def step(ctl, backend):
    """One training step as the runtime drives it: started, maybe traced (three times as
    slow), run, reported."""
    ctl.step_started()
    trace = ctl.before_step()
    backend.traced.append(trace)
    backend.clock += backend.step_time() * (3 if trace else 1)
    ctl.after_step("trace" if trace else None)


def drive(ctl, backend, steps):
    for _ in range(steps):
        step(ctl, backend)


def until(ctl, backend, done, limit=3000):
    """Steps until ``done()``; how many it took."""
    for n in range(limit):
        if done():
            return n
        step(ctl, backend)
    raise AssertionError(f"not done after {limit} steps (phase {ctl.phase})")


def decided(ctl, n):
    return lambda: len(ctl.history) >= n and ctl.history[n - 1].status != "measuring"
