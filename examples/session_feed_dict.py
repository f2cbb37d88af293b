"""A plain TF1 training script: Session, feed_dict, a Saver. Run it with FASTT=1 to let fastt
place it; nothing in it knows about fastt."""
import argparse
import os
import tempfile

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=150)
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--out", help="checkpoint directory (default: a new private "
                    "temporary directory)")
args = parser.parse_args()
out = args.out or tempfile.mkdtemp(prefix="fastt-example-session-")

tf1.set_random_seed(0)
rng = np.random.RandomState(0)
images = rng.rand(args.batch * 8, 32, 32, 3).astype(np.float32)
# ten classes by brightness rank: learnable, balanced
labels = np.argsort(np.argsort(images.mean(axis=(1, 2, 3)))) * 10 // len(images)



def conv(h, filters, name):
    with tf1.variable_scope(name):
        w = tf1.get_variable("kernel", [3, 3, h.shape[-1], filters])
        b = tf1.get_variable("bias", [filters], initializer=tf1.zeros_initializer())
        h = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(h, w, 1, "SAME"), b))
        return tf.nn.max_pool2d(h, 2, 2, "VALID")


def dense(h, units, name, relu=True):
    with tf1.variable_scope(name):
        w = tf1.get_variable("kernel", [h.shape[-1], units])
        b = tf1.get_variable("bias", [units], initializer=tf1.zeros_initializer())
        h = tf.matmul(h, w) + b
        return tf.nn.relu(h) if relu else h


x = tf1.placeholder(tf.float32, [None, 32, 32, 3], name="images")
y = tf1.placeholder(tf.int64, [None], name="labels")
h = conv(conv(x, 32, "conv1"), 64, "conv2")
h = dense(tf.reshape(h, [-1, 8 * 8 * 64]), 128, "fc1")
logits = dense(h, 10, "logits", relu=False)
loss = tf1.losses.sparse_softmax_cross_entropy(y, logits)
step = tf1.train.get_or_create_global_step()
train_op = tf1.train.MomentumOptimizer(0.01, 0.9).minimize(loss, global_step=step)
saver = tf1.train.Saver()

os.makedirs(out, exist_ok=True)
with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    for i in range(args.steps):
        k = i % 8
        feed = {x: images[k * args.batch:(k + 1) * args.batch],
                y: labels[k * args.batch:(k + 1) * args.batch]}
        _, value = sess.run([train_op, loss], feed_dict=feed)
        if (i + 1) % 20 == 0:
            print(f"step {i + 1}: loss {value:.6f}", flush=True)
    path = saver.save(sess, os.path.join(out, "model.ckpt"), global_step=step)
    print(f"checkpoint: {path}")
    print(f"final loss: {value:.9g}")
