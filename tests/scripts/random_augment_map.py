"""Data augmentation in a tf.data map function with seeded random ops (random crop, flip,
brightness), as image tutorials do; each step prints a checksum of the batch it trained on,
which must be the same draws with and without fastt."""
import argparse
import os
import random

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="random_augment_map")
args = parser.parse_args()

random.seed(17)
np.random.seed(17)
tf1.set_random_seed(17)
rng = np.random.RandomState(17)
images = rng.rand(256, 20, 20, 3).astype(np.float32)
labels = rng.randint(0, 10, 256).astype(np.int64)


def augment(x, y):
    x = tf1.random_crop(x, [16, 16, 3], seed=1)
    x = tf1.image.random_flip_left_right(x, seed=2)
    x = tf1.image.random_brightness(x, 0.2, seed=3)
    return x, y


ds = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().map(augment).batch(32)
x, y = tf1.data.make_one_shot_iterator(ds).get_next()
checksum = tf.reduce_sum(tf.cast(x, tf.float64) * tf.range(1, 33, dtype=tf.float64)[:, None,
                                                                                    None, None])
h = tf1.layers.conv2d(x, 8, 3, activation=tf.nn.relu)
logits = tf1.layers.dense(tf1.layers.flatten(h), 10)
loss = tf1.losses.sparse_softmax_cross_entropy(y, logits)
train = tf1.train.GradientDescentOptimizer(0.05).minimize(loss)
saver = tf1.train.Saver()

with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    for i in range(100):
        _, value, drawn = sess.run([train, loss, checksum])
        print(f"step {i + 1}: loss {value:.6f}")
        print(f"random batch {i + 1}: {drawn!r}")
    os.makedirs(args.out, exist_ok=True)
    print("checkpoint:", saver.save(sess, os.path.join(args.out, "model.ckpt")))
    print("final loss:", value)
