"""An LSTM sequence classifier with ``tf.nn.dynamic_rnn`` (a while loop in the step and its
gradient), as TF1 RNN tutorials write it."""
import argparse
import os
import random

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="dynamic_rnn_classifier")
args = parser.parse_args()

random.seed(23)
np.random.seed(23)
tf1.set_random_seed(23)
rng = np.random.RandomState(23)
seqs = rng.rand(256, 12, 8).astype(np.float32)
labels = (seqs[:, :, 0].sum(axis=1) > 6).astype(np.int64)

x = tf1.placeholder(tf.float32, [None, 12, 8], name="x")
y = tf1.placeholder(tf.int64, [None], name="y")
cell = tf1.nn.rnn_cell.LSTMCell(32)
outputs, state = tf1.nn.dynamic_rnn(cell, x, dtype=tf.float32)
logits = tf1.layers.dense(state.h, 2)
loss = tf1.losses.sparse_softmax_cross_entropy(y, logits)
step = tf1.train.get_or_create_global_step()
train = tf1.train.AdamOptimizer(1e-2).minimize(loss, global_step=step)
saver = tf1.train.Saver()

with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    for i in range(100):
        k = i % 8
        _, value = sess.run([train, loss], {x: seqs[k * 32:(k + 1) * 32],
                                            y: labels[k * 32:(k + 1) * 32]})
        print(f"step {i + 1}: loss {value:.6f}")
    print("global step", sess.run(step))
    os.makedirs(args.out, exist_ok=True)
    print("checkpoint:", saver.save(sess, os.path.join(args.out, "model.ckpt")))
    print("final loss:", value)
