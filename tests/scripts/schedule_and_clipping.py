"""Benchmark-script style: a global step, an exponentially decayed learning rate, gradients
clipped by their global norm, Momentum, apply_gradients; an MLP fed from numpy."""
import argparse
import os

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="/tmp/schedule_and_clipping")
args = parser.parse_args()

tf1.set_random_seed(3)
rng = np.random.RandomState(3)
data = rng.randn(1024, 32).astype(np.float32)
target = (data[:, :8].sum(axis=1) > 0).astype(np.int32)

global_step = tf1.train.get_or_create_global_step()
inputs = tf1.placeholder(tf.float32, [None, 32])
labels = tf1.placeholder(tf.int32, [None])
hidden = inputs
for i, width in enumerate([64, 64]):
    w = tf1.get_variable(f"fc{i}/w", [hidden.shape[-1], width],
                         initializer=tf1.glorot_uniform_initializer())
    hidden = tf.nn.relu(tf.matmul(hidden, w) + tf1.get_variable(f"fc{i}/b", [width]))
logits = tf.matmul(hidden, tf1.get_variable("out/w", [64, 2]))
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                     logits=logits))
lr = tf1.train.exponential_decay(0.1, global_step, 40, 0.7, staircase=True)
opt = tf1.train.MomentumOptimizer(lr, 0.9)
grads, variables = zip(*opt.compute_gradients(loss))
grads, norm = tf.clip_by_global_norm(grads, 1.0)
train_op = opt.apply_gradients(zip(grads, variables), global_step=global_step)
saver = tf1.train.Saver(max_to_keep=2)

with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    for _ in range(160):
        step = sess.run(global_step)
        k = step % 16
        feed = {inputs: data[k * 64:(k + 1) * 64], labels: target[k * 64:(k + 1) * 64]}
        _, value, rate = sess.run([train_op, loss, lr], feed)
        if step % 40 == 0:
            print(f"step {step} loss {value:.5f} lr {rate:.4f}")
    os.makedirs(args.out, exist_ok=True)
    print("checkpoint:", saver.save(sess, os.path.join(args.out, "model"), global_step=global_step))
    print("final loss:", value)
