"""The plan cache with real sessions: the training graph's digest; a second run of the same
training step on the same devices starts on the plan the first kept, with the same losses; a
changed feed shape or device set misses and says which."""
import logging

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1
tf1.disable_eager_execution()

import fastt.plugin  # noqa: E402
from fastt.adapters.fingerprint import graph_digest  # noqa: E402
from fastt.plugin.settings import parse_devices  # noqa: E402
from tests.plugin_helpers import build, settings, train  # noqa: E402
from tf_patches.session_hook import plugin_of  # noqa: E402


def digest(batch=16, lr=0.1, act=tf.nn.relu, reverse=False):
    g = tf.Graph()
    with g.as_default():
        ds = tf.data.Dataset.from_tensor_slices(np.zeros((64, 8), np.float32)).batch(batch)
        x = tf1.data.make_one_shot_iterator(ds).get_next()
        w = tf1.get_variable("w", [8, 4])
        loss = tf.reduce_mean(act(tf.matmul(x, w)))
        tf1.train.GradientDescentOptimizer(lr).minimize(loss)
    gd = g.as_graph_def()
    if reverse:
        nodes = list(gd.node)[::-1]
        del gd.node[:]
        gd.node.extend(nodes)
    return graph_digest(gd)


def test_the_graph_digest_changes_with_ops_and_batch_sizes_not_with_learning_rates():
    base = digest()
    assert digest() == base and digest(reverse=True) == base
    assert digest(lr=0.2) == base  # a float constant's value: not the graph's shape
    assert digest(batch=32) != base  # a dataset's batch size is
    assert digest(act=tf.nn.tanh) != base


def run(m, steps, feeds=None):
    m = m._replace(feeds=feeds) if feeds is not None else m
    sess, losses, _ = train(m, steps=steps)
    ctl = plugin_of(sess).controller
    history = [(e.name, e.status, e.cached) for e in ctl.history]
    sess.close()
    return losses, history


def test_a_second_run_starts_on_the_kept_plan_and_a_change_misses(plugin, tmp_path, caplog):
    cache = str(tmp_path / "cache")
    # the first run keeps its first plan whatever it measures, so there is one to cache
    plugin(cache_dir=cache, rollback=False, max_rounds=1, order=False)
    caplog.set_level(logging.INFO, logger="fastt")
    first, h1 = run(build(), 80)
    assert h1[0][1] == "active" and not h1[0][2]
    caplog.clear()
    second, h2 = run(build(), 80)
    assert h2[0][2] and h2[0][0] == h1[0][0], h2  # from the cache: no plan made
    assert "plan cache:" in caplog.text and "planned" not in caplog.text
    np.testing.assert_allclose(second, first, rtol=1e-5)  # the same training, step by step
    caplog.clear()
    m = build()
    half = [{k: v[:8] for k, v in f.items()} for f in m.feeds]
    _, h3 = run(m, 80, feeds=half)
    assert not h3[0][2] and "changed since the plan cached for this script: the shapes " \
        "it feeds" in caplog.text
    fastt.plugin.uninstall()
    devices, cpus = parse_devices("cpu:3")
    fastt.plugin.install(settings(tmp_path, cache_dir=cache, rollback=False, max_rounds=1,
                                  order=False, devices=devices, logical_cpus=cpus))
    caplog.clear()
    _, h4 = run(build(), 80)
    assert not h4[0][2] and "its devices" in caplog.text
