"""Save a checkpoint part-way, keep training, then restore it (as a script does after a bad
epoch) and train on from there."""
import argparse
import os

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="/tmp/saver_restore_midway")
args = parser.parse_args()
os.makedirs(args.out, exist_ok=True)

tf1.set_random_seed(5)
rng = np.random.RandomState(5)
xs = rng.rand(256, 20).astype(np.float32)
ys = rng.randint(0, 5, 256)
x = tf1.placeholder(tf.float32, [None, 20])
y = tf1.placeholder(tf.int64, [None])
w1 = tf1.get_variable("w1", [20, 48])
w2 = tf1.get_variable("w2", [48, 5])
logits = tf.matmul(tf.nn.tanh(tf.matmul(x, w1)), w2)
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
step = tf1.train.get_or_create_global_step()
train = tf1.train.RMSPropOptimizer(0.01).minimize(loss, global_step=step)
saver = tf1.train.Saver()

with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    for i in range(140):
        k = i % 8
        _, value = sess.run([train, loss], {x: xs[k * 32:(k + 1) * 32], y: ys[k * 32:(k + 1) * 32]})
        if i == 59:
            midway = saver.save(sess, os.path.join(args.out, "midway"))
        if i == 99:
            saver.restore(sess, midway)
            print("restored", midway, "at global step", sess.run(step))
    print("global step:", sess.run(step))
    print("checkpoint:", saver.save(sess, os.path.join(args.out, "model.ckpt")))
    print("final loss:", value)
