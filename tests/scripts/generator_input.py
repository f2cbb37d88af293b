"""Input from a Python generator (``tf.data.Dataset.from_generator``) through an
initializable iterator, re-initialized each epoch, as many TF1 tutorials feed their data."""
import argparse
import os
import random

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="generator_input")
args = parser.parse_args()

random.seed(7)
np.random.seed(7)
tf1.set_random_seed(7)
rng = np.random.RandomState(7)
xs = rng.rand(320, 24).astype(np.float32)
ys = (xs[:, :6].sum(axis=1) * 2).astype(np.int64) % 5


def examples():
    for i in range(len(xs)):
        yield xs[i], ys[i]


ds = tf.data.Dataset.from_generator(
    examples, output_types=(tf.float32, tf.int64),
    output_shapes=(tf.TensorShape([24]), tf.TensorShape([]))).batch(32)
it = tf1.data.make_initializable_iterator(ds)
x, y = it.get_next()
h = tf1.layers.dense(x, 64, activation=tf.nn.relu)
logits = tf1.layers.dense(h, 5)
loss = tf1.losses.sparse_softmax_cross_entropy(y, logits)
step = tf1.train.get_or_create_global_step()
train = tf1.train.AdamOptimizer(1e-2).minimize(loss, global_step=step)
saver = tf1.train.Saver()

with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    for epoch in range(12):
        sess.run(it.initializer)
        batches = 0
        while True:
            try:
                _, value = sess.run([train, loss])
                batches += 1
                print(f"step {sess.run(step)}: loss {value:.6f}")
            except tf.errors.OutOfRangeError:
                break
        print(f"epoch {epoch} batches {batches}")
    print("global step", sess.run(step))
    os.makedirs(args.out, exist_ok=True)
    print("checkpoint:", saver.save(sess, os.path.join(args.out, "model.ckpt")))
    print("final loss:", value)
