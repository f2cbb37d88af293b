"""Builders shared by the tests of the session plugin (TensorFlow: import after
``pytest.importorskip("tensorflow")``)."""
import collections
import json
import math
import os

import numpy as np
import tensorflow as tf

from fastt.plugin.settings import Settings, parse_devices

tf1 = tf.compat.v1
STEPS = 80


def settings(tmp_path, **kw):
    devices, cpus = parse_devices("cpu:2")
    # short runs: fastt tries its strategies whatever they cost (no overhead budget)
    base = dict(enabled=True, devices=devices, logical_cpus=cpus, dump_dir=str(tmp_path),
                warmup_steps=2, profile_steps=1, measure_steps=3, measure_seconds=0.0,
                max_rounds=2, overhead_fraction=math.inf, overhead_s=math.inf)
    base.update(kw)
    return Settings(**base)


def build(with_data=False, with_table=False):
    """A small classifier: placeholders or a tf.data iterator, Momentum, a global step;
    optionally labels mapped through a lookup table."""
    g = tf.Graph()
    with g.as_default():
        tf1.set_random_seed(1)
        rng = np.random.RandomState(0)
        xs = rng.rand(64, 20).astype(np.float32)
        ys = rng.randint(0, 4, 64)
        if with_data:
            ds = tf.data.Dataset.from_tensor_slices((np.arange(64), xs, ys)).shuffle(
                64, seed=3).repeat().batch(16, drop_remainder=True)
            idx, x, y = tf1.data.make_one_shot_iterator(ds).get_next()
        else:
            idx = None
            x = tf1.placeholder(tf.float32, [None, 20], name="x")
            y = tf1.placeholder(tf.int64, [None], name="y")
        if with_table:
            table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
                tf.range(4, dtype=tf.int64), tf.constant([3, 2, 1, 0], tf.int64)), -1)
            y = table.lookup(y)
        w1 = tf1.get_variable("w1", [20, 64])
        w2 = tf1.get_variable("w2", [64, 4])
        logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=logits))
        step = tf1.train.get_or_create_global_step()
        train = tf1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, global_step=step)
        init = tf.group(tf1.global_variables_initializer(), tf1.tables_initializer())
        saver = tf1.train.Saver()
    y_in = g.get_tensor_by_name("y:0") if not with_data else None
    feeds = [] if with_data else [{x: xs[i:i + 16], y_in: ys[i:i + 16]}
                                  for i in range(0, 64, 16)]
    return collections.namedtuple("M", "g x y idx loss train init step saver feeds")(
        g, x, y, idx, loss, train, init, step, saver, feeds)


def train(m, steps=STEPS, fetch_idx=False):
    sess = tf1.Session(graph=m.g)
    sess.run(m.init)
    losses, seen = [], []
    for i in range(steps):
        fetches = [m.train, m.loss] + ([m.idx] if fetch_idx else [])
        out = sess.run(fetches, m.feeds[i % len(m.feeds)] if m.feeds else None)
        losses.append(out[1])
        if fetch_idx:
            seen.extend(out[2].tolist())
    return sess, losses, seen


def statuses(tmp_path):
    out = {}
    for d in sorted(os.listdir(tmp_path)):
        if d.startswith("strategy-"):
            with open(tmp_path / d / "strategy.json") as f:
                out[d] = json.load(f)
    return out
