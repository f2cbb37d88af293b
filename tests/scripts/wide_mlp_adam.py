"""A wide MLP on MNIST-shaped data, the tutorial way: placeholders, Adam, a Session, a Saver.
Its weights and Adam's slots are most of its memory (the corpus test runs it with fastt told
that each device holds less than the whole model)."""
import argparse
import os

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--out", default="/tmp/wide_mlp_adam")
args = parser.parse_args()

rng = np.random.RandomState(1)
data = rng.rand(args.batch * 4, 784).astype(np.float32)
target = (data[:, :392].sum(axis=1) > data[:, 392:].sum(axis=1)).astype(np.int64)


def dense(h, units, name):
    with tf1.variable_scope(name):
        w = tf1.get_variable("weights", [h.shape[-1], units],
                             initializer=tf1.glorot_uniform_initializer(seed=len(name)))
        b = tf1.get_variable("biases", [units], initializer=tf1.zeros_initializer())
        return tf.matmul(h, w) + b


x = tf1.placeholder(tf.float32, [None, 784])
y = tf1.placeholder(tf.int64, [None])
hidden1 = tf.nn.relu(dense(x, 2048, "hidden1"))
hidden2 = tf.nn.relu(dense(hidden1, 2048, "hidden2"))
logits = dense(hidden2, 10, "logits")
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
train_op = tf1.train.AdamOptimizer(1e-4).minimize(loss)
saver = tf1.train.Saver()

with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    for i in range(args.steps):
        k = i % 4
        _, value = sess.run([train_op, loss], {x: data[k * args.batch:(k + 1) * args.batch],
                                               y: target[k * args.batch:(k + 1) * args.batch]})
        if (i + 1) % 20 == 0:
            print(f"step {i + 1}: loss {value:.6f}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    print(f"checkpoint: {saver.save(sess, os.path.join(args.out, 'model.ckpt'))}")
    print(f"final loss: {value:.9g}")
