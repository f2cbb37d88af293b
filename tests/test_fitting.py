"""A training step that would not fit the memory its device enforces runs, from its first
step, as the backend fits it; fitted again smaller when it still runs out of memory; as it is,
said once, when nothing fits (the controller on a fake backend, no TensorFlow)."""
import logging

from fastt.plugin.settings import Settings
from tests.fake_backend import FakeBackend, controller_of, drive

MiB = 2 ** 20
WHY = "the training step would hold 100.0 MiB on CPU:0, more than the 60.0 MiB allowed"


class ResourceExhaustedError(Exception):
    """TensorFlow's out-of-memory error, as the controller recognises it (by name)."""


def test_a_step_that_does_not_fit_runs_fitted_from_its_first_step(caplog):
    b = FakeBackend({None: 0.010, "memory-fit": 0.012})
    b.held = 10 * MiB  # what the device holds already: the step may hold the rest
    ctl = controller_of(Settings(), b)
    with caplog.at_level(logging.INFO, logger="fastt"):
        ctl.fit_memory(60 * MiB, WHY)
    assert b.fits == [50 * MiB] and b.activations == ["memory-fit"] and not b.ordered
    entry = ctl.history[0]
    assert entry.status == "active" and ctl.active is entry and entry.decided_at == 0
    assert entry.reason == f"{WHY}: 2 micro-batches in turn"
    assert b.records == [(1, "active")]  # its dump written
    said = [r.message for r in caplog.records]
    assert said == [f"fastt: {WHY}; it runs with 2 micro-batches in turn, and fastt plans "
                    "nothing more in this session"]
    drive(ctl, b, 30)  # nothing more is traced, planned or activated
    assert ctl.phase == "off" and not any(b.traced) and b.plans == []
    assert b.activations == ["memory-fit"]
    ctl.close()
    assert b.stored == []  # fitted again at the next run's first step: nothing cached


def test_a_fitted_step_out_of_memory_is_fitted_again_smaller_then_given_up():
    """Each refit plans the step for less than the last fit did (what the device held
    before the step is not measured again: the failed graph's state still counts then)."""
    b = FakeBackend({None: 0.010, "memory-fit": 0.012})
    ctl = controller_of(Settings(), b)
    ctl.fit_memory(60 * MiB, WHY)
    oom = ResourceExhaustedError("OOM when allocating tensor")
    assert not ctl.refit(ValueError("not memory"))  # another error is not refitted
    assert ctl.refit(oom)
    assert b.fits == [60 * MiB, 0.7 * 60 * MiB] and b.activations == ["memory-fit"] * 2
    entry = ctl.history[0]  # 50 MiB in 2 micro-batches is over 42 MiB: 4 now
    assert len(ctl.history) == 1 and entry.strategy.note == "4 micro-batches in turn"
    assert entry.reason == f"{WHY}: 2 micro-batches in turn; refitted: 4 micro-batches in turn"
    assert ctl.refit(oom) and ctl.refit(oom)  # 29.4, then 20.6 MiB: 4, then 8 micro-batches
    assert entry.strategy.note == "8 micro-batches in turn"
    assert not ctl.refit(oom)  # three times at most
    assert len(b.fits) == 4 and b.activations == ["memory-fit"] * 4


def test_a_refit_that_finds_nothing_smaller_gives_up(caplog):
    b = FakeBackend({None: 0.010})
    b.need = 400 * MiB  # 50 MiB at 8 micro-batches: fits 60, not 42
    ctl = controller_of(Settings(), b)
    ctl.fit_memory(60 * MiB, WHY)
    caplog.clear()  # the fit's own line, where the fastt logger passes INFO on
    with caplog.at_level(logging.WARNING, logger="fastt"):
        assert not ctl.refit(ResourceExhaustedError("OOM"))
    assert b.activations == ["memory-fit"]
    assert [r.message for r in caplog.records] == [
        "fastt: strategy 1 (memory-fit) ran out of memory, and nothing smaller "
        "fits (no gradient accumulation fits 42.0 MiB)"]


def test_nothing_that_fits_leaves_the_step_as_it_is_said_once(caplog):
    b = FakeBackend({None: 0.010})
    b.need = 1000 * MiB  # 125 MiB at 8 micro-batches: over 60
    ctl = controller_of(Settings(), b)
    with caplog.at_level(logging.INFO, logger="fastt"):
        ctl.fit_memory(60 * MiB, WHY)
    assert b.activations == [] and ctl.history == [] and ctl.phase == "off"
    assert [r.message for r in caplog.records] == [
        f"fastt: {WHY}, and nothing fastt can run fits: no gradient accumulation fits 60.0 MiB; "
        "the step runs as it is"]
    assert not ctl.refit(ResourceExhaustedError("OOM"))  # no fitted step to fit again
