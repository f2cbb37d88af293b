"""Seeded random streams continued in a new session: the stateless rewrite reproduces what the
stateful kernel would have drawn next, for every op kind, static and run-time shapes."""
import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1
tf1.disable_eager_execution()

from fastt.plugin.streams import StreamCounter, continue_streams, counter_name  # noqa: E402


def _graph():
    g = tf.Graph()
    with g.as_default():
        tf1.set_random_seed(5)
        n = tf1.placeholder(tf.int32, [], name="n")
        ops = [tf1.random_uniform([3, 4], name="uniform"),
               tf1.random_normal([n, 2], name="normal"),
               tf1.truncated_normal([n], name="truncated"),
               tf1.random_uniform([n, 3], maxval=1 << 40, dtype=tf.int64, name="int"),
               tf.raw_ops.RandomUniform(shape=[2], dtype=tf.float32, name="unseeded")]
        pred = tf1.placeholder_with_default(True, [], name="pred")
        tf1.cond(pred, lambda: tf1.random_uniform([2]), lambda: tf.zeros([2]))
    return g, n, ops


def _draws(sess, counter, tensors, n, sizes):
    out = []
    for size in sizes:
        names = [t.name for t in tensors]
        key, extra = counter.extra(names, [], [n.name])
        values = sess.run(tensors + extra, {n: size})
        counter.count(key, values[len(tensors):])
        out.append(values[:len(tensors)])
    return out


def test_a_new_session_continues_each_stream_where_the_old_one_stopped():
    g, n, tensors = _graph()
    seeded = tensors[:4]
    with tf1.Session(graph=g) as sess:  # the reference: one session all along
        reference = [sess.run(seeded, {n: size}) for size in (4, 7, 2, 5)]
    with tf1.Session(graph=g) as sess:
        counter = StreamCounter(g)
        before = _draws(sess, counter, seeded, n, (4, 7))
    gd, counters, left = continue_streams(g.as_graph_def(), g)
    kinds = {"RandomUniform", "RandomStandardNormal", "TruncatedNormal", "RandomUniformInt"}
    drawn = [op.name for op in g.get_operations() if op.type in kinds and op.get_attr("seed")
             and "cond" not in op.name]
    assert len(drawn) == 4 and sorted(counters) == sorted(map(counter_name, drawn))
    assert len(left) == 1 and "cond" in left[0]  # inside tf.cond: left as it is
    assert "unseeded" not in " ".join(counters)
    inner = tf.Graph()
    with inner.as_default():
        tf1.import_graph_def(gd, name="")
        writes = [tf.raw_ops.AssignVariableOp(resource=inner.get_tensor_by_name(f"{c}:0"),
                                              value=tf.constant(v))
                  for c, v in counter.values().items()]
    with tf1.Session(graph=inner) as sess:
        sess.run(writes)
        mine = [inner.get_tensor_by_name(t.name) for t in seeded]
        after = [sess.run(mine, {inner.get_tensor_by_name("n:0"): s}) for s in (2, 5)]
    for got, want in zip(before + after, reference):
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_a_run_that_does_not_reach_a_random_op_does_not_advance_it():
    g, n, tensors = _graph()
    with tf1.Session(graph=g) as sess:
        counter = StreamCounter(g)
        _draws(sess, counter, tensors[:1], n, (3,))
        key, extra = counter.extra([n.name], [], [n.name])  # a fetch of a fed tensor only
        counter.count(key, [])
    assert counter.values() == {counter_name("uniform/RandomUniform"): 256 * 12}
