"""TF1 tutorial style, migrated with the standard line: disable_v2_behavior() (reference
variables), a linear model, GradientDescentOptimizer, feed_dict, a Saver."""
import argparse
import os

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()

parser = argparse.ArgumentParser()
parser.add_argument("--out", default="/tmp/ref_linear_regression")
args = parser.parse_args()

rng = np.random.RandomState(42)
train_X = rng.rand(512, 16).astype(np.float32)
train_Y = train_X.dot(rng.rand(16, 1).astype(np.float32)) + 0.3

X = tf.placeholder("float", [None, 16])
Y = tf.placeholder("float", [None, 1])
W = tf.Variable(tf.zeros([16, 1]), name="weight")
b = tf.Variable(tf.zeros([1]), name="bias")
pred = tf.add(tf.matmul(X, W), b)
cost = tf.reduce_sum(tf.pow(pred - Y, 2)) / (2 * 64)
optimizer = tf.train.GradientDescentOptimizer(0.05).minimize(cost)
init = tf.global_variables_initializer()
saver = tf.train.Saver()

with tf.Session() as sess:
    sess.run(init)
    for epoch in range(150):
        i = epoch % 8
        _, c = sess.run([optimizer, cost], feed_dict={X: train_X[i * 64:(i + 1) * 64],
                                                      Y: train_Y[i * 64:(i + 1) * 64]})
        if (epoch + 1) % 50 == 0:
            print("Epoch:", "%04d" % (epoch + 1), "cost=", "{:.9f}".format(c))
    print("Training cost=", sess.run(cost, feed_dict={X: train_X, Y: train_Y}))
    os.makedirs(args.out, exist_ok=True)
    print("checkpoint:", saver.save(sess, os.path.join(args.out, "model.ckpt")))
    print("final loss:", c)
