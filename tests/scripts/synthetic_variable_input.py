"""CNN-benchmark style synthetic data: the images and labels of one batch drawn once at
initialization into local variables (no placeholder, no iterator), read by every step; a
conv net written with tf.nn ops and get_variable, Momentum, a global step."""
import argparse
import os

import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="/tmp/synthetic_variable_input")
parser.add_argument("--batch_size", type=int, default=32)
args = parser.parse_args()

tf1.set_random_seed(23)
shape = [args.batch_size, 16, 16, 3]
images = tf1.get_local_variable("synthetic_images", initializer=tf1.truncated_normal(
    shape, dtype=tf.float32, mean=127, stddev=60), trainable=False)
labels = tf1.get_local_variable("synthetic_labels", initializer=tf1.random_uniform(
    [args.batch_size], minval=0, maxval=9, dtype=tf.int32), trainable=False)
net = (images - 127.0) / 60.0
for i, depth in enumerate([16, 32]):
    kernel = tf1.get_variable(f"conv{i}/kernel", [3, 3, net.shape[-1], depth])
    net = tf.nn.relu(tf.nn.conv2d(net, kernel, [1, 1, 1, 1], "SAME"))
    net = tf.nn.max_pool2d(net, 2, 2, "VALID")
net = tf.reshape(net, [-1, 4 * 4 * 32])
logits = tf.matmul(net, tf1.get_variable("fc/kernel", [4 * 4 * 32, 10]))
loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
global_step = tf1.train.get_or_create_global_step()
train_op = tf1.train.MomentumOptimizer(0.005, 0.9).minimize(loss, global_step=global_step)
saver = tf1.train.Saver()
with tf1.Session() as sess:
    sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
    for step in range(100):
        _, value = sess.run([train_op, loss])
        if step % 25 == 0:
            print(f"step {step} loss {value:.5f}")
    os.makedirs(args.out, exist_ok=True)
    print("checkpoint:", saver.save(sess, os.path.join(args.out, "model.ckpt"),
                                    global_step=global_step))
    print("final loss:", value)
