"""Faults inside fastt never end or change the user's run: each phase of an activation fails
in turn (of a strategy, and of the return to the original graph), a dump that cannot be
written, errors of the script's own code, graphs that grow after the session opened."""
import errno
import logging

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1

from fastt.adapters import engine  # noqa: E402
from fastt.plugin import activation, backend, runtime, session_dumps, state  # noqa: E402
from tests.plugin_helpers import build, statuses, train  # noqa: E402
from tf_patches import session_hook  # noqa: E402

STEPS = 60


class Injected(RuntimeError):
    pass


class Fault:
    """Raises ``Injected`` in one phase of the activations of ``target`` ("strategy": a
    planned graph; "original": the return to the original graph): once, or every time
    (``persistent``)."""

    def __init__(self, monkeypatch, phase, target, persistent=False):
        self.phase, self.target, self.activating, self.raised = phase, target, None, 0
        self.persistent = persistent
        start = backend.PluginBackend._start

        def tracked(be, strategy, ordered=True):
            self.activating = strategy
            return start(be, strategy, ordered)
        monkeypatch.setattr(backend.PluginBackend, "_start", tracked)
        where = {"rewrite": (engine.Engine, "rewrite"), "session": (activation, "open_session"),
                 "capture": (activation.Running, "capture"),
                 "restore": (state.StateOps, "restore"),
                 "first step": (session_hook, "run_elements")}[phase]
        original = getattr(*where)

        def maybe_raise(*a, **kw):
            if self.due():
                self.raised += 1
                raise Injected(f"{phase} failed")
            return original(*a, **kw)
        monkeypatch.setattr(*where, maybe_raise)
        if target == "original":  # every strategy measures slower: it is rolled back
            dispatch = runtime.SessionPlugin._dispatch

            def slow(p, *args):
                if p.current.strategy is not None:
                    import time
                    time.sleep(0.01)
                return dispatch(p, *args)
            monkeypatch.setattr(runtime.SessionPlugin, "_dispatch", slow)

    def due(self):
        if self.raised and not self.persistent:
            return False
        if self.activating is None and self.target == "strategy":
            return False
        if self.activating is not None and self.target == "original":
            return False
        return True


def variables(sess):
    with sess.graph.as_default():
        vs = tf1.global_variables()
    return {v.op.name: value for v, value in zip(vs, sess.run(vs))}


def run_with(monkeypatch, plugin, caplog, phase, target, persistent=False):
    """Train with the fault and without fastt: the losses step by step and the variables at
    the end agree within reassociation; the fault was hit."""
    ref_sess, ref, _ = train(build(), steps=STEPS)
    ref_vars = variables(ref_sess)
    fault = Fault(monkeypatch, phase, target, persistent)
    plugin()
    with caplog.at_level(logging.INFO, logger="fastt"):
        sess, losses, _ = train(build(), steps=STEPS)
    assert fault.raised, "the fault was never reached"
    np.testing.assert_allclose(losses, ref, rtol=1e-4)
    got = variables(sess)
    assert sorted(got) == sorted(ref_vars)
    for name, value in ref_vars.items():  # within reassociation of the strategies' sums
        np.testing.assert_allclose(got[name], value, rtol=1e-4,
                                   atol=1e-5 * float(np.abs(value).max()), err_msg=name)
    return sess


@pytest.mark.parametrize("target", ["strategy", "original"])
@pytest.mark.parametrize("phase", ["rewrite", "session", "capture", "restore", "first step"])
def test_a_failing_activation_phase_leaves_the_run_as_without_fastt(
        plugin, monkeypatch, caplog, phase, target):
    sess = run_with(monkeypatch, plugin, caplog, phase, target)
    if target == "strategy":  # fastt stopped: on the original graph, in some session
        assert session_hook.plugin_of(sess).current.strategy is None
    assert "could not return to the original graph" not in caplog.text
    sess.close()


def test_a_running_graph_whose_state_cannot_be_read_keeps_training(plugin, monkeypatch,
                                                                   caplog):
    """The state never comes out of the running strategy's session: training stays on it,
    and fastt says so."""
    sess = run_with(monkeypatch, plugin, caplog, "capture", "original", persistent=True)
    assert "could not return to the original graph" in caplog.text
    assert session_hook.plugin_of(sess).current.strategy is not None
    sess.close()


def test_a_dump_that_cannot_be_written_never_stops_training(plugin, monkeypatch, tmp_path,
                                                             caplog):
    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(session_dumps, "write", full)
    _, ref, _ = train(build(), steps=STEPS)
    plugin()
    with caplog.at_level(logging.INFO, logger="fastt"):
        sess, losses, _ = train(build(), steps=STEPS)
        sess.close()
    np.testing.assert_allclose(losses, ref, rtol=1e-4)
    said = [r.message for r in caplog.records
            if "could not write a dump" in r.message and str(tmp_path) in r.message]
    assert len(said) == 1 and "FASTT_DUMP_DIR" in said[0] and "No space left" in said[0]
    closing = [r.message for r in caplog.records
               if "session closed" in r.message and str(tmp_path) in r.message]
    assert closing and "no dump could be written in FASTT_DUMP_DIR" in closing[-1]


def test_a_dump_directory_that_is_a_file(plugin, tmp_path, caplog):
    target = tmp_path / "a-file"
    target.write_text("not a directory")
    _, ref, _ = train(build(), steps=STEPS)
    plugin(dump_dir=str(target))
    with caplog.at_level(logging.INFO, logger="fastt"):
        sess, losses, _ = train(build(), steps=STEPS)
        sess.close()
    np.testing.assert_allclose(losses, ref, rtol=1e-4)
    assert target.read_text() == "not a directory"
    assert not list(tmp_path.glob("*.tmp"))


def test_an_error_of_the_scripts_own_code_reaches_it_unchanged(plugin, tmp_path):
    """A ``py_func`` that fails on one step (after fastt activated a strategy): the script
    sees its own error, the step is not run again (its side effect happens once), and fastt
    goes on."""
    plugin()
    g = tf.Graph()
    calls = []

    def through(v):
        calls.append(1)
        if len(calls) == 40:
            raise ValueError("the script's own error")
        return v
    with g.as_default():
        tf1.set_random_seed(1)
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        xp = tf1.py_func(through, [x], tf.float32, stateful=True, name="user_py")
        xp.set_shape([None, 8])
        w = tf1.get_variable("w", [8, 4])
        loss = tf.reduce_mean(tf.square(tf.matmul(xp, w)))
        train_op = tf1.train.GradientDescentOptimizer(0.01).minimize(loss)
        init = tf1.global_variables_initializer()
    xs = np.random.RandomState(0).rand(16, 8).astype(np.float32)
    sess = tf1.Session(graph=g)
    sess.run(init)
    p = session_hook.plugin_of(sess)
    errors = []
    for _ in range(60):
        try:
            sess.run(train_op, {x: xs})
        except tf.errors.OpError as e:
            errors.append((e, p.current is not p.user))
    assert len(errors) == 1 and "the script's own error" in str(errors[0][0])
    assert errors[0][1], "the error came from the script's own session, not fastt's"
    assert len(calls) == 60  # no step ran twice
    assert p.controller is not None and p.controller.phase != "off"
    assert all(d["status"] != "failed" for d in statuses(tmp_path).values())
    sess.close()


def _in_threads(n, fn):
    """Run ``fn(i)`` in ``n`` threads at once; their results, or the errors they died of."""
    import threading
    results, errors = [None] * n, []
    barrier = threading.Barrier(n)

    def body(i):
        try:
            barrier.wait()
            results[i] = fn(i)
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a thread hangs"
    return results, errors


def test_two_sessions_in_two_threads_profile_one_at_a_time(plugin, tmp_path, caplog):
    _, ref, _ = train(build(), steps=STEPS)
    plugin()
    with caplog.at_level(logging.INFO, logger="fastt"):
        results, errors = _in_threads(2, lambda i: train(build(), steps=STEPS))
    assert not errors, errors
    for sess, losses, _ in results:
        np.testing.assert_allclose(losses, ref, rtol=1e-4)
        ctl = session_hook.plugin_of(sess).controller
        assert ctl is not None and ctl.history, (ctl.phase, caplog.text)
        sess.close()
    assert all(d["status"] != "failed" for d in statuses(tmp_path).values())


def test_hogwild_threads_on_one_session_all_run_and_fastt_steps_aside(plugin, tmp_path,
                                                                       caplog):
    """Four threads run the training step of one session at once: every step runs once
    (global_step counts them all), no thread dies, fastt says once that it steps aside."""
    plugin()
    m = build()
    sess = tf1.Session(graph=m.g)
    sess.run(m.init)
    per_thread = 60

    def steps(i):
        for k in range(per_thread):
            sess.run(m.train, m.feeds[(i + k) % len(m.feeds)])
    with caplog.at_level(logging.INFO, logger="fastt"):
        _, errors = _in_threads(4, steps)
    assert not errors, errors
    assert sess.run(m.step) == 4 * per_thread
    found = [r for r in caplog.records if "training step found" in r.message]
    aside = [r for r in caplog.records if "several threads at once" in r.message]
    assert len(found) <= 1 and len(aside) == 1, [r.message for r in caplog.records]
    p = session_hook.plugin_of(sess)
    assert p.current is p.user and p.detector.off
    sess.close()


@pytest.mark.parametrize("where,nth", [("plan", 1), ("_start", 1), ("_start", 2)])
def test_ctrl_c_inside_fastt_reaches_the_script_and_leaves_a_working_session(
        plugin, monkeypatch, tmp_path, caplog, where, nth):
    """Ctrl-C while fastt plans, activates a strategy, or returns from one: the script
    gets its KeyboardInterrupt, can go on (here: finishes its steps), the losses are those
    without fastt, and every strategy tried is in the dumps with how it ended."""
    method = getattr(backend.PluginBackend, where)
    calls = []

    def interrupted(self, *a, **kw):
        calls.append(1)
        if len(calls) == nth:
            raise KeyboardInterrupt
        return method(self, *a, **kw)
    monkeypatch.setattr(backend.PluginBackend, where, interrupted)
    _, ref, _ = train(build(), steps=STEPS)
    m = build()
    plugin()
    sess = tf1.Session(graph=m.g)
    sess.run(m.init)
    losses, interrupts = [], 0
    with caplog.at_level(logging.INFO, logger="fastt"):
        for i in range(STEPS):
            try:
                losses.append(sess.run([m.train, m.loss], m.feeds[i % len(m.feeds)])[1])
            except KeyboardInterrupt:  # the script's handler: the step ran, carry on
                interrupts += 1
                losses.append(np.nan)
    assert interrupts == 1
    done = ~np.isnan(losses)
    np.testing.assert_allclose(np.array(losses)[done], np.array(ref)[done], rtol=1e-4)
    assert sess.run(m.step) == STEPS
    docs = statuses(tmp_path)
    assert all(d["status"] != "measuring" for d in docs.values()), docs
    assert len(docs) == (where == "_start")  # the strategy activated or returned from
    assert "KeyboardInterrupt while fastt was in its" in caplog.text
    assert session_hook.plugin_of(sess).current.strategy is None
    sess.close()


@pytest.mark.parametrize("devices", [
    [f"/job:localhost/replica:0/task:0/device:GPU:{i}" for i in (0, 3)],
    [f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in (0, 1)]])
def test_devices_the_session_does_not_have_are_named_at_once(plugin, caplog, devices):
    _, ref, _ = train(build(), steps=30)
    plugin(devices=devices, logical_cpus=1)
    with caplog.at_level(logging.INFO, logger="fastt"):
        sess, losses, _ = train(build(), steps=30)
    warned = [r.message for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "FASTT_DEVICES names" in warned[0] and devices[1] in warned[0]
    assert "this session runs as it is" in warned[0]
    assert losses == ref
    sess.close()


def test_devices_of_one_process_are_probed_once_per_kind_of_link():
    """``FASTT_DEVICES=cpu:64``: one link probed both ways, not 64 * 63 (minutes inside
    the user's step); tasks of a cluster: every pair, as each may be another machine."""
    from fastt.adapters.probe import unprobed
    from fastt.costs import CostModels
    from fastt.costs.comm import PROBED
    from fastt.profiler import TransferSample
    cpus = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(64)]
    models = CostModels()
    links, _ = unprobed(models, cpus)
    assert len(links) == 2 and links[0] == links[1][::-1]  # one pair, both ways
    models.comm.update([TransferSample(*link, n, 1e-5 + n * 1e-9, tensor=PROBED)
                        for link in links for n in (1e5, 1e6, 1e7)])
    assert unprobed(models, cpus)[0] == []
    tasks = [f"/job:worker/replica:0/task:{t}/device:CPU:0" for t in range(3)]
    assert len(unprobed(models, tasks)[0]) == 6


def test_a_failure_is_said_in_one_line_naming_the_op_and_why():
    from fastt.plugin.messages import failure
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None])
        checked = tf.debugging.check_numerics(x / 0.0, "infinite", name="checked")
    with tf1.Session(graph=g) as sess:
        with pytest.raises(tf.errors.InvalidArgumentError) as e:
            sess.run(checked, {x: [1.0]})
    line = failure(e.value)
    assert "\n" not in line and "Graph execution error" not in line
    assert line.startswith("InvalidArgumentError at op 'checked' (CheckNumerics): infinite")


def test_verify_passes_every_strategy_of_a_correct_rewrite(plugin, tmp_path, caplog):
    _, ref, _ = train(build(), steps=STEPS)
    plugin(verify=True)
    with caplog.at_level(logging.INFO, logger="fastt"):
        sess, losses, _ = train(build(), steps=STEPS)
    said = [r.message for r in caplog.records if "verified the first step" in r.message]
    assert said and all("within reassociation" in m for m in said), said
    assert all(d["status"] != "failed" for d in statuses(tmp_path).values())
    np.testing.assert_allclose(losses, ref, rtol=1e-4)
    sess.close()


def test_verify_catches_a_rewrite_that_drops_a_variable_update(plugin, monkeypatch,
                                                               tmp_path, caplog):
    """A broken rewrite: the training step no longer waits for w2's update (a dropped
    control dependency), so w2 is never trained on fastt's graph. The first step of the
    strategy is caught, the strategy fails with the difference named, and training goes on
    on the original graph from the state before that step: losses as without fastt."""
    rewrite = engine.Engine.rewrite

    def dropped(self, strategy, order="none"):
        gd, graph = rewrite(self, strategy, order)
        if strategy is not None:
            for node in gd.node:
                kept = [i for i in node.input
                        if not (i.startswith("^") and "update_w2" in i and "Apply" in i)]
                del node.input[:]
                node.input.extend(kept)
        return gd, graph
    monkeypatch.setattr(engine.Engine, "rewrite", dropped)
    _, ref, _ = train(build(), steps=STEPS)
    plugin(verify=True)
    with caplog.at_level(logging.INFO, logger="fastt"):
        sess, losses, _ = train(build(), steps=STEPS)
    docs = list(statuses(tmp_path).values())
    assert docs[0]["status"] == "failed", docs[0]["reason"]
    assert "beyond reassociation" in docs[0]["reason"] and "w2" in docs[0]["reason"]
    assert session_hook.plugin_of(sess).current.strategy is None
    np.testing.assert_allclose(losses, ref, rtol=1e-4)
    sess.close()
