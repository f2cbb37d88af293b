"""Input through tf.py_func: a Python generator of batches behind the graph (no placeholder,
no iterator), the way older scripts wrapped numpy augmentation."""
import argparse
import random
import os

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="/tmp/pyfunc_input")
args = parser.parse_args()

rng = np.random.RandomState(11)
pool = rng.rand(960, 6, 6, 2).astype(np.float32)
pool_labels = rng.randint(0, 3, 960).astype(np.int32)
cursor = [0]


def next_batch():
    k = cursor[0] % 30
    cursor[0] += 1
    flipped = pool[k * 32:(k + 1) * 32, :, ::-1, :]  # "augmentation"
    return np.ascontiguousarray(flipped), pool_labels[k * 32:(k + 1) * 32]


images, labels = tf1.py_func(next_batch, [], [tf.float32, tf.int32], stateful=True)
images.set_shape([32, 6, 6, 2])
labels.set_shape([32])
random.seed(11)  # tf.layers draws its initializers' seeds from Python's random
np.random.seed(11)
tf1.set_random_seed(11)
net = tf1.layers.conv2d(images, 6, 3, activation=tf.nn.relu)
net = tf1.layers.dense(tf1.layers.flatten(net), 3)
loss = tf1.losses.sparse_softmax_cross_entropy(labels, net)
train = tf1.train.GradientDescentOptimizer(0.2).minimize(loss)
saver = tf1.train.Saver()
with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    for i in range(150):
        _, value = sess.run([train, loss])
    print("batches drawn:", cursor[0])
    os.makedirs(args.out, exist_ok=True)
    print("checkpoint:", saver.save(sess, os.path.join(args.out, "model.ckpt")))
    print("final loss:", value)
