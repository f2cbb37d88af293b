"""The session plugin in-process: unchanged training code, state carried bit for bit, rollback,
failures that leave training on the original graph, every fetch and feed form."""
import collections
import logging
import os
import subprocess
import sys
import time

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1
tf1.disable_eager_execution()

import fastt.plugin  # noqa: E402
from fastt.errors import FasttError  # noqa: E402
from fastt.adapters import engine  # noqa: E402
from fastt.plugin import backend, guard, runtime  # noqa: E402
from tests.helpers import ROOT  # noqa: E402
from tests.plugin_helpers import STEPS, build, statuses, train  # noqa: E402
from tf_patches import session_hook  # noqa: E402


def test_without_fastt_nothing_is_patched():
    code = ("import tensorflow; from tensorflow.python.client import session; "
            "print(session.BaseSession.run.__module__)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTT")}
    env["PYTHONPATH"] = ROOT
    plain = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, check=True).stdout.split()[-1]
    on = subprocess.run([sys.executable, "-c", code], env={**env, "FASTT": "1"},
                        capture_output=True, text=True, check=True).stdout.split()[-1]
    assert plain == "tensorflow.python.client.session"
    assert on == "tf_patches.session_hook"


def test_uninstall_restores_tensorflows_methods(plugin):
    original = session_hook.BaseSession.__dict__["run"]
    plugin()
    assert session_hook.BaseSession.__dict__["run"] is not original
    fastt.plugin.uninstall()
    assert session_hook.BaseSession.__dict__["run"] is original


def test_state_is_carried_bit_for_bit(plugin, monkeypatch, tmp_path):
    carried = []
    activate = backend.PluginBackend.activate

    def checked(self, strategy, ordered=True):
        before = self.plugin.current.capture()
        activate(self, strategy, ordered)
        after = self.plugin.current.capture()
        carried.append((before, after))
    monkeypatch.setattr(backend.PluginBackend, "activate", checked)
    ref_sess, ref, _ = train(build())
    plugin()
    sess, losses, _ = train(build())
    assert len(carried) >= 2  # an activation, and a rollback or a second activation
    for before, after in carried:
        assert sorted(before.values) == sorted(after.values) and len(before.values) >= 5
        for name, value in before.values.items():
            assert value.dtype == after.values[name].dtype
            assert value.tobytes() == after.values[name].tobytes(), name
    assert session_hook.plugin_of(sess).current is not session_hook.plugin_of(sess).user
    np.testing.assert_allclose(losses, ref, rtol=1e-4)


def test_a_slower_strategy_is_rolled_back(plugin, monkeypatch, tmp_path, caplog):
    dispatch = runtime.SessionPlugin._dispatch

    def slow_when_planned(self, *args):  # every planned strategy measures slower
        if self.current.strategy is not None:
            time.sleep(0.05)
        return dispatch(self, *args)
    monkeypatch.setattr(runtime.SessionPlugin, "_dispatch", slow_when_planned)
    _, ref, _ = train(build())
    plugin()
    with caplog.at_level(logging.INFO, logger="fastt"):
        sess, losses, _ = train(build())
    docs = statuses(tmp_path)
    assert len(docs) == 2 and all(d["status"] == "rolled_back" for d in docs.values())
    assert all("slower than the original graph" in d["reason"] for d in docs.values())
    assert all(d["measured_step_time_s"] > d["original_step_time_s"] for d in docs.values())
    assert sum("rolled back strategy" in r.message for r in caplog.records) == 2
    assert session_hook.plugin_of(sess).current.strategy is None  # on the original graph
    np.testing.assert_allclose(losses, ref, rtol=1e-4)


def _warnings(caplog):
    return [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == "fastt"]


def assert_falls_back(plugin, caplog, message):
    """Training with fastt logs one warning containing ``message``, ends on the original
    graph, and its losses are bit for bit those of training without fastt."""
    _, ref, _ = train(build())
    plugin()
    with caplog.at_level(logging.INFO, logger="fastt"):
        sess, losses, _ = train(build())
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and message in warnings[0].message
    assert session_hook.plugin_of(sess).current.strategy is None
    assert losses == ref
    return sess


def test_an_injected_failure_leaves_training_on_the_original_graph(plugin, monkeypatch,
                                                                    tmp_path, caplog):
    def broken(*a, **kw):
        raise RuntimeError("injected")
    monkeypatch.setattr(engine, "rewrite", broken)
    sess = assert_falls_back(plugin, caplog, "injected")
    assert session_hook.plugin_of(sess).controller.phase == "off"
    assert [d["status"] for d in statuses(tmp_path).values()] == ["failed"]


def test_a_strategy_the_rewriter_refuses_leaves_training_running(plugin, monkeypatch,
                                                                 tmp_path, caplog):
    plan = backend.PluginBackend.plan

    def unplaced(self, name):
        s = plan(self, name)
        s.placement.pop(next(iter(s.placement)))  # the rewriter refuses unplaced ops
        return s
    monkeypatch.setattr(backend.PluginBackend, "plan", unplaced)
    assert_falls_back(plugin, caplog, "places no device")


def test_a_strategy_failing_at_an_op_names_it_in_one_line_and_keeps_the_error(
        plugin, monkeypatch, tmp_path, caplog):
    rewrite = engine.Engine.rewrite

    def mismatched(self, strategy, order="none"):
        gd, graph = rewrite(self, strategy, order)
        if strategy is not None:  # the first matmul now multiplies mismatched shapes
            node = next(n for n in gd.node if n.op == "MatMul")
            node.attr["transpose_a"].b = True
        return gd, graph
    monkeypatch.setattr(engine.Engine, "rewrite", mismatched)
    assert_falls_back(plugin, caplog, "(MatMul): ")
    line = _warnings(caplog)[0].message
    assert line.startswith("fastt: strategy 1 (") and " failed: InvalidArgumentError at op " \
        in line and "\n" not in line, line
    assert line.endswith("training continues on the original graph, and fastt plans nothing "
                         "more in this session"), line
    doc = next(iter(statuses(tmp_path).values()))
    assert doc["status"] == "failed" and "Matrix size-incompatible" in doc["error"]


def test_strict_mode_raises_the_failure(plugin, monkeypatch):
    monkeypatch.setattr(engine, "rewrite", lambda *a, **kw: (_ for _ in ()).throw(
        FasttError("refused")))
    plugin(strict=True)
    with pytest.raises(FasttError, match="refused"):
        train(build())


Pair = collections.namedtuple("Pair", "loss step")


def test_every_fetch_and_feed_form_after_activation(plugin):
    plugin()
    m = build()
    sess, _, _ = train(m)
    p = session_hook.plugin_of(sess)
    assert p.current is not p.user and sess.graph is m.g
    feed = m.feeds[0]
    loss = sess.run(m.loss, feed)
    by_name = sess.run(m.loss.name, {"x:0": feed[m.x], "y:0": feed[m.y]})
    assert by_name == loss
    out = sess.run({"a": [m.loss, (m.step,)], "b": Pair(m.loss, m.step), "op": m.step.op},
                   feed)
    assert out["a"][0] == loss and isinstance(out["a"][1], tuple)
    assert isinstance(out["b"], Pair) and out["b"].step == out["a"][1][0] == STEPS
    assert out["op"] is None
    call = sess.make_callable([m.loss, m.step], feed_list=[m.x, m.y])
    assert call(feed[m.x], feed[m.y]) == [loss, STEPS]
    h = sess.partial_run_setup([m.loss], [m.x, m.y])
    assert sess.partial_run(h, m.loss, feed) == loss
    with pytest.raises(ValueError, match="Cannot feed value of shape"):
        sess.run(m.loss, {m.x: np.zeros((16, 3), np.float32), m.y: feed[m.y]})
    assert p.controller.phase != "off"  # the user's mistake is not fastt's failure


def test_checkpoints_saved_through_fastt_restore_without_it(plugin, tmp_path):
    plugin()
    m = build()
    sess, _, _ = train(m)
    assert session_hook.plugin_of(sess).current is not session_hook.plugin_of(sess).user
    path = m.saver.save(sess, str(tmp_path / "ckpt" / "model"), global_step=m.step)
    with m.g.as_default():
        names = [v.op.name for v in tf1.global_variables()]
        expected = sess.run(tf1.global_variables())
    fastt.plugin.uninstall()
    fresh = build()
    with tf1.Session(graph=fresh.g) as plain:
        assert "tf_patches" not in type(plain).run.__module__
        fresh.saver.restore(plain, path)
        with fresh.g.as_default():
            got = plain.run([v for v in tf1.global_variables() if v.op.name in names])
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert np.array_equal(a, b)
    assert path.endswith(f"model-{STEPS}")


def test_tf_data_positions_are_carried(plugin):
    _, ref, ref_seen = train(build(with_data=True), fetch_idx=True)
    plugin()
    sess, losses, seen = train(build(with_data=True), fetch_idx=True)
    p = session_hook.plugin_of(sess)
    assert p.current is not p.user and p.user.state.iterators
    assert seen == ref_seen  # no sample skipped or seen twice across activations
    np.testing.assert_allclose(losses, ref, rtol=1e-4)


def test_a_step_that_never_ends_returns_to_the_original_graph(plugin, monkeypatch, caplog):
    """The first step of a new graph runs with a deadline. Here one variable's update waits
    on an empty queue while the other's runs: the state must come back from before the step,
    not from the half-updated session."""
    rewrite = engine.rewrite

    def hanging(ir, strategy, **order):
        gd = rewrite(ir, strategy, **order)
        g = tf.Graph()
        with g.as_default():
            tf1.import_graph_def(gd, name="")
            q = tf1.FIFOQueue(1, tf.float32, shapes=[[]], name="never")
            stuck = q.dequeue(name="never_dequeue")
        gd = g.as_graph_def()
        for node in gd.node:
            if node.op == "ResourceApplyMomentum" and "w2" in node.name:
                node.input.append("^" + stuck.op.name)
        return gd
    monkeypatch.setattr(engine, "rewrite", hanging)
    monkeypatch.setattr(guard, "FIRST_STEP_TIMEOUT_S", 2.0)
    # Bitwise equal losses: the half-applied step was discarded, then retried once.
    assert_falls_back(plugin, caplog, "DeadlineExceeded")


def test_lookup_tables_are_initialized_in_the_new_session(plugin):
    _, ref, _ = train(build(with_table=True))
    plugin()
    sess, losses, _ = train(build(with_table=True))
    assert session_hook.plugin_of(sess).current is not session_hook.plugin_of(sess).user
    np.testing.assert_allclose(losses, ref, rtol=1e-4)


def test_data_parallelism_splits_a_batch_fed_without_a_static_size(plugin, tmp_path):
    """Placeholders of shape [None, ...] feeding ops grappler fuses (conv + bias + relu),
    whose shapes no run reports: the data-parallel strategy still cuts the whole batch."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 12, 12, 3], name="x")
        y = tf1.placeholder(tf.int64, [None], name="y")
        w = tf1.get_variable("w", [3, 3, 3, 8])
        b = tf1.get_variable("b", [8])
        h = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME", name="conv"), b))
        logits = tf.matmul(tf.reshape(h, [-1, 12 * 12 * 8]), tf1.get_variable("v", [1152, 4]))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=logits))
        train_op = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
        init = tf1.global_variables_initializer()
    rng = np.random.RandomState(0)
    feed = {x: rng.rand(16, 12, 12, 3).astype(np.float32), y: rng.randint(0, 4, 16)}
    plugin(max_rounds=1)
    with tf1.Session(graph=g) as sess:
        sess.run(init)
        for _ in range(STEPS):
            sess.run([train_op, loss], feed)
    dp = [d for d in statuses(tmp_path).values() if d["strategy"] == "data-parallel"]
    assert dp, statuses(tmp_path)
    placement = dp[0]["placement"]
    devices = dp[0]["devices"]
    assert placement["conv/part0"] == devices[0] and placement["conv/part1"] == devices[1]
    backward = [n for n in placement if n.startswith("gradients/") and n.endswith("/part1")]
    assert any("Conv2DBackpropFilter" in n for n in backward), backward


def test_mirrored_copies_follow_every_write_of_their_variable(plugin, tmp_path):
    """Data parallelism with mirrored variables (ring all-reduce), kept active: after it is
    active the script assigns a weight directly, runs the initializer of another, and
    restores a checkpoint (a saver's group of assigns); each replica's copy follows (replica
    1 reads its copy: a stale one would change the losses), so the losses stay those of
    training without fastt."""
    def script(m, sess_factory):
        with m.g.as_default():
            w1 = next(v for v in tf1.global_variables() if v.op.name == "w1")
            w2 = next(v for v in tf1.global_variables() if v.op.name == "w2")
            halve = w1.assign(w1 * 0.5)
            value = np.full((64, 4), 0.01, np.float32)
        sess = sess_factory()
        sess.run(m.init)
        losses = []
        for i in range(3 * STEPS // 2):
            if i == STEPS // 2:
                path = m.saver.save(sess, str(tmp_path / "ckpt" / "m"))
            if i == STEPS:
                sess.run(halve)
            if i == STEPS + 5:
                w2.load(value, sess)  # its initializer, fed
            if i == STEPS + 10:
                m.saver.restore(sess, path)
            losses.append(sess.run([m.train, m.loss], m.feeds[i % len(m.feeds)])[1])
        return sess, losses

    m = build()
    _, ref = script(m, lambda: tf1.Session(graph=m.g))
    plugin(strategy="data-parallel", rollback=False, max_rounds=1)
    m = build()
    sess, losses = script(m, lambda: tf1.Session(graph=m.g))
    cur = session_hook.plugin_of(sess).current
    assert cur is not session_hook.plugin_of(sess).user
    assert cur.strategy.name == "data-parallel" and cur.has("w1/mirror1")
    np.testing.assert_allclose(losses, ref, rtol=1e-4)
