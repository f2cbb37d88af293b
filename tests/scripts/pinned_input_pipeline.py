"""CIFAR-10 tutorial style: the input pipeline pinned to the CPU (``with tf.device('/cpu:0')``),
read through a one-shot iterator, a small CNN on the default device."""
import argparse
import os
import random

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="pinned_input_pipeline")
args = parser.parse_args()

random.seed(11)
np.random.seed(11)
tf1.set_random_seed(11)
rng = np.random.RandomState(11)
images = rng.rand(512, 16, 16, 3).astype(np.float32)
labels = rng.randint(0, 10, 512).astype(np.int64)

with tf.device("/cpu:0"):
    ds = tf.data.Dataset.from_tensor_slices((images, labels))
    ds = ds.map(lambda x, y: (tf.image.per_image_standardization(x), y))
    ds = ds.shuffle(256, seed=11).repeat().batch(32)
    x, y = tf1.data.make_one_shot_iterator(ds).get_next()
h = tf1.layers.conv2d(x, 16, 3, activation=tf.nn.relu)
h = tf1.layers.max_pooling2d(h, 2, 2)
h = tf1.layers.conv2d(h, 16, 3, activation=tf.nn.relu)
logits = tf1.layers.dense(tf1.layers.flatten(h), 10)
loss = tf1.losses.sparse_softmax_cross_entropy(y, logits)
step = tf1.train.get_or_create_global_step()
train = tf1.train.MomentumOptimizer(0.01, 0.9).minimize(loss, global_step=step)
saver = tf1.train.Saver()

with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    for i in range(120):
        _, value = sess.run([train, loss])
        print(f"step {i + 1}: loss {value:.6f}")
    print("global step", sess.run(step))
    os.makedirs(args.out, exist_ok=True)
    print("checkpoint:", saver.save(sess, os.path.join(args.out, "model.ckpt")))
    print("final loss:", value)
