"""A tf.compat.v1.layers CNN trained with feed_dict; the accuracy op is built after training
(the graph grows) and evaluated with a plain sess.run on the whole test set (another batch
size), then on a last batch smaller than the training batch."""
import argparse
import random
import os

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="/tmp/layers_eval_after_training")
args = parser.parse_args()

random.seed(1)  # tf.layers draws its initializers' seeds from Python's random
np.random.seed(1)
tf1.set_random_seed(1)
rng = np.random.RandomState(1)
images = rng.rand(640, 12, 12, 1).astype(np.float32)
labels = (images.mean(axis=(1, 2, 3)) * 10).astype(np.int64) % 4
test_images, test_labels = images[:300], labels[:300]

x = tf1.placeholder(tf.float32, [None, 12, 12, 1], name="x")
y = tf1.placeholder(tf.int64, [None], name="y")
net = tf1.layers.conv2d(x, 8, 3, padding="same", activation=tf.nn.relu)
net = tf1.layers.max_pooling2d(net, 2, 2)
net = tf1.layers.conv2d(net, 16, 3, padding="same", activation=tf.nn.relu)
net = tf1.layers.flatten(net)
net = tf1.layers.dense(net, 32, activation=tf.nn.relu)
logits = tf1.layers.dense(net, 4)
loss = tf1.losses.sparse_softmax_cross_entropy(labels=y, logits=logits)
train_op = tf1.train.AdamOptimizer(1e-3).minimize(loss)
saver = tf1.train.Saver()

sess = tf1.Session()
sess.run(tf1.global_variables_initializer())
for step in range(120):
    k = step % 10
    _, value = sess.run([train_op, loss], {x: images[k * 64:(k + 1) * 64],
                                           y: labels[k * 64:(k + 1) * 64]})
correct = tf.equal(tf.argmax(logits, 1), y)
accuracy = tf.reduce_mean(tf.cast(correct, tf.float32))
print("test accuracy:", sess.run(accuracy, feed_dict={x: test_images, y: test_labels}))
print("last batch accuracy:", sess.run(accuracy, feed_dict={x: images[-23:], y: labels[-23:]}))
os.makedirs(args.out, exist_ok=True)
print("checkpoint:", saver.save(sess, os.path.join(args.out, "model.ckpt")))
print("final loss:", value)
sess.close()
