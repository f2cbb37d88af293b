"""Benchmark style synthetic input with fresh randomness in every step: a base batch drawn
once into a local variable, jittered each step by seeded random noise and a random crop;
tf.nn.dropout with a keep_prob placeholder (0.5 to train, 1.0 to evaluate), as the classic
MNIST tutorial wrote it. Every step prints a digest of its random values."""
import argparse
import hashlib
import os

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="/tmp/dropout_random_input")
parser.add_argument("--steps", type=int, default=80)
args = parser.parse_args()


def digest(*arrays):
    return hashlib.sha1(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)
                        ).hexdigest()[:12]


tf1.set_random_seed(2020)
base = tf1.get_local_variable("base_images", initializer=tf1.random_normal([32, 14, 14, 1]),
                              trainable=False)
labels = tf1.get_local_variable("base_labels", initializer=tf1.random_uniform(
    [32], maxval=10, dtype=tf.int64), trainable=False)
noise = tf1.random_uniform([32, 14, 14, 1], -0.1, 0.1, name="noise")
images = tf1.random_crop(base + noise, [32, 12, 12, 1])
keep_prob = tf1.placeholder(tf.float32, name="keep_prob")

w1 = tf.Variable(tf1.truncated_normal([5, 5, 1, 16], stddev=0.1), name="conv_w")
h = tf.nn.relu(tf.nn.conv2d(images, w1, [1, 1, 1, 1], "SAME") + tf.Variable(
    tf.constant(0.1, shape=[16]), name="conv_b"))
h = tf.nn.max_pool2d(h, 2, 2, "SAME")
h = tf.reshape(h, [-1, 6 * 6 * 16])
w2 = tf.Variable(tf1.truncated_normal([6 * 6 * 16, 64], stddev=0.1), name="fc_w")
h = tf.nn.relu(tf.matmul(h, w2))
h_drop = tf1.nn.dropout(h, keep_prob)
logits = tf.matmul(h_drop, tf.Variable(tf1.truncated_normal([64, 10], stddev=0.1),
                                       name="out_w"))
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                     logits=logits))
accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32))
train_op = tf1.train.AdamOptimizer(1e-3).minimize(loss)
mask = [op for op in tf1.get_default_graph().get_operations()
        if op.type == "RandomUniform" and op.name.startswith("dropout")][0].outputs[0]
saver = tf1.train.Saver()
with tf1.Session() as sess:
    sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
    for step in range(args.steps):
        _, value, n, m, x = sess.run([train_op, loss, noise, mask, images], {keep_prob: 0.5})
        print(f"random step {step} {digest(n, m, x)}")
    print(f"test accuracy {sess.run(accuracy, {keep_prob: 1.0}):.4f}")
    os.makedirs(args.out, exist_ok=True)
    print("checkpoint:", saver.save(sess, os.path.join(args.out, "model.ckpt")))
    print("final loss:", value)
