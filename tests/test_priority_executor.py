"""fastt's priority executor, a TensorFlow executor plugin: built at install, it runs graphs as
TensorFlow's default executor does (control flow, errors, step stats, async transfers), ready
ops taken by ``_fastt_priority``."""
import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1
tf1.disable_eager_execution()

from tensorflow.core.framework import attr_value_pb2  # noqa: E402

from tf_patches import priority_executor  # noqa: E402
from tf_patches.priority_executor import EXECUTOR_TYPE, PRIORITY_ATTR  # noqa: E402


def config(priority=True, devices=1, inter_op=0):
    cfg = tf1.ConfigProto(device_count={"CPU": devices}, inter_op_parallelism_threads=inter_op)
    cfg.graph_options.rewrite_options.disable_meta_optimizer = True  # ops as built
    if priority:
        cfg.experimental.executor_type = EXECUTOR_TYPE
    return cfg


def test_the_library_is_built_for_this_tensorflow_and_loads():
    path = priority_executor.library_path()
    assert path is not None, "pip install . did not build tf_patches/_priority_executor*.so"
    assert priority_executor.built_for(path) == tf.__version__
    assert priority_executor.load()


@pytest.fixture(autouse=True)
def _loaded():
    if not priority_executor.load():
        pytest.fail("the priority executor is not available (see the test above)")


def _set_priority(op, p):
    op._set_attr(PRIORITY_ATTR, attr_value_pb2.AttrValue(i=p))


def _start_order(run_metadata, names):
    """``names`` in the order their kernels started (nanoseconds)."""
    starts = {}
    for dev in run_metadata.step_stats.dev_stats:
        for ns in dev.node_stats:
            if ns.node_name in names:
                starts[ns.node_name] = ns.all_start_nanos or 1000 * ns.all_start_micros
    assert set(starts) == set(names)
    return sorted(starts, key=starts.get)


@pytest.mark.parametrize("reverse", [False, True])
def test_one_thread_runs_ready_ops_by_priority(reverse):
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [4096], name="x")
        ops = [tf.math.multiply(x, float(i + 1), name=f"m{i}") for i in range(24)]
        rng = np.random.RandomState(0)
        prio = {op.op.name: int(p) for op, p in zip(ops, rng.permutation(len(ops)))}
        if reverse:
            prio = {n: -p for n, p in prio.items()}
        for op in ops:
            _set_priority(op.op, prio[op.op.name])
    meta = tf1.RunMetadata()
    with tf1.Session(graph=g, config=config(inter_op=1)) as sess:
        sess.run(ops, {x: np.ones(4096, np.float32)},
                 options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE),
                 run_metadata=meta)
    assert _start_order(meta, set(prio)) == sorted(prio, key=lambda n: -prio[n])


def _control_flow_graph():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [8], name="x")
        i0 = tf.constant(0)
        _, acc = tf1.while_loop(lambda i, a: i < 5, lambda i, a: (i + 1, a * 1.5 + tf.sin(a)),
                                [i0, x])
        out = tf1.cond(tf.reduce_sum(acc) > 0, lambda: acc * 2.0, lambda: acc - 1.0)
        nested = tf1.while_loop(
            lambda i, a: i < 3,
            lambda i, a: (i + 1, tf1.cond(i > 0, lambda: a + 1.0, lambda: a * 3.0)), [i0, out])
    return g, x, [out, nested[1]]


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_control_flow_and_step_stats_match_the_default_executor(sign):
    g, x, fetches = _control_flow_graph()
    feed = {x: sign * np.arange(1, 9, dtype=np.float32)}
    results, stats = [], []
    for priority in (False, True):
        meta = tf1.RunMetadata()
        with tf1.Session(graph=g, config=config(priority)) as sess:
            results.append(sess.run(fetches, feed, options=tf1.RunOptions(
                trace_level=tf1.RunOptions.FULL_TRACE), run_metadata=meta))
        stats.append(sorted(ns.node_name for d in meta.step_stats.dev_stats
                            for ns in d.node_stats))
    for got, want in zip(results[1], results[0]):
        np.testing.assert_array_equal(got, want)
    # Every executed node, iterations and dead branches included, is in the step stats.
    assert stats[1] == stats[0] and len(stats[1]) > 30


def test_a_kernel_error_surfaces_as_under_the_default_executor():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [3], name="x")
        y = tf.debugging.check_numerics(tf.math.log(x), "log of x")
        z = y * 2.0
    errors = []
    for priority in (False, True):
        with tf1.Session(graph=g, config=config(priority)) as sess:
            np.testing.assert_allclose(sess.run(z, {x: [1.0, 2.0, 3.0]}),
                                       2 * np.log([1.0, 2.0, 3.0]), rtol=1e-6)
            with pytest.raises(tf.errors.InvalidArgumentError) as e:
                sess.run(z, {x: [1.0, -1.0, 3.0]})
            errors.append(e.value)
            assert sess.run(z, {x: [1.0, 1.0, 1.0]}).tolist() == [0.0, 0.0, 0.0]  # still usable
    assert type(errors[1]) is type(errors[0])
    assert errors[1].op.name == errors[0].op.name == y.op.name
    assert "log of x" in errors[1].message


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_thousand_multi_device_runs_neither_hang_nor_leak():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [256, 256], name="x")
        h = x
        for i in range(12):  # each op on the other device: a Send/Recv pair per edge
            with tf.device(f"/cpu:{i % 2}"):
                h = tf.tanh(tf.matmul(h, x) * 0.01 + float(i))
                _set_priority(h.op, i)
        with tf.device("/cpu:0"):
            out = tf.reduce_sum(h)
    feed = {x: np.random.RandomState(0).rand(256, 256).astype(np.float32) * 0.1}
    with tf1.Session(graph=g, config=config(devices=2)) as sess, \
            tf1.Session(graph=g, config=config(priority=False, devices=2)) as ref:
        want = ref.run(out, feed)
        opts = tf1.RunOptions(timeout_in_ms=60000)  # a hang fails instead of blocking
        for _ in range(100):
            np.testing.assert_allclose(sess.run(out, feed, options=opts), want, rtol=1e-6)
        before = _rss_bytes()
        for _ in range(900):
            sess.run(out, feed, options=opts)
        after = _rss_bytes()
    assert after <= 1.05 * before, (before, after)
