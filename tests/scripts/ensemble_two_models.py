"""An ensemble: the session is opened first, then two small CNNs are built, each with its own
optimizer, and trained in one loop (two training steps in one session)."""
import argparse
import os
import random

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="ensemble_two_models")
parser.add_argument("--steps", type=int, default=60)
args = parser.parse_args()

random.seed(3)
np.random.seed(3)
tf1.set_random_seed(3)
rng = np.random.RandomState(3)
images = rng.rand(256, 12, 12, 1).astype(np.float32)
labels = rng.randint(0, 4, 256).astype(np.int64)

sess = tf1.Session()  # opened before the models exist, as some tutorials do
x = tf1.placeholder(tf.float32, [None, 12, 12, 1], name="x")
y = tf1.placeholder(tf.int64, [None], name="y")


def model(name):
    with tf1.variable_scope(name):
        h = tf1.layers.conv2d(x, 8, 3, activation=tf.nn.relu)
        h = tf1.layers.conv2d(h, 8, 3, activation=tf.nn.relu)
        logits = tf1.layers.dense(tf1.layers.flatten(h), 4)
        loss = tf1.losses.sparse_softmax_cross_entropy(y, logits)
        step = tf1.train.AdamOptimizer(1e-3).minimize(
            loss, var_list=tf1.trainable_variables(name))
    return loss, step


loss0, step0 = model("model0")
loss1, step1 = model("model1")
saver = tf1.train.Saver()
sess.run(tf1.global_variables_initializer())
for it in range(args.steps):
    k = it % 8
    feed = {x: images[k * 32:(k + 1) * 32], y: labels[k * 32:(k + 1) * 32]}
    _, l0 = sess.run([step0, loss0], feed)
    _, l1 = sess.run([step1, loss1], feed)
    print(f"step {it}: loss {l0:.6f} {l1:.6f}")
os.makedirs(args.out, exist_ok=True)
print("checkpoint:", saver.save(sess, os.path.join(args.out, "ensemble.ckpt")))
print("final loss:", l0 + l1)
sess.close()
