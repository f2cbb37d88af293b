"""A benchmark-style training script that reports its own throughput, as tf_cnn_benchmarks
does: images/sec over the last steps. Plain TF1 (Session, feed_dict); nothing in it knows
about fastt."""
import argparse
import time

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()
parser = argparse.ArgumentParser()
parser.add_argument("--model", choices=["mlp", "cnn", "wide_cnn"], default="cnn")
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--steps", type=int, default=500)
parser.add_argument("--timed", type=int, default=150, help="last steps timed")
args = parser.parse_args()

tf1.set_random_seed(1)
rng = np.random.RandomState(1)
size = 28 if args.model == "mlp" else 32
images = rng.rand(args.batch * 4, size, size, 3).astype(np.float32)
labels = np.argsort(np.argsort(images.mean(axis=(1, 2, 3)))) * 10 // len(images)
x = tf1.placeholder(tf.float32, [None, size, size, 3])
y = tf1.placeholder(tf.int64, [None])
if args.model == "mlp":
    h = tf.reshape(x, [-1, size * size * 3])
    for i, width in enumerate([512, 512, 256]):
        h = tf1.layers.dense(h, width, tf.nn.relu, name=f"fc{i}")
else:
    widths = [32, 64, 128] if args.model == "cnn" else [64, 128, 256]
    h = x
    for i, width in enumerate(widths):
        h = tf1.layers.conv2d(h, width, 3, padding="same", activation=tf.nn.relu,
                              name=f"conv{i}")
        h = tf1.layers.max_pooling2d(h, 2, 2)
    h = tf1.layers.dense(tf1.layers.flatten(h), 256, tf.nn.relu, name="fc")
logits = tf1.layers.dense(h, 10, name="logits")
loss = tf1.losses.sparse_softmax_cross_entropy(y, logits)
train_op = tf1.train.MomentumOptimizer(0.01, 0.9).minimize(loss)

with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    start = None
    for step in range(args.steps):
        if step == args.steps - args.timed:
            start = time.perf_counter()
        k = step % 4
        sess.run(train_op, {x: images[k * args.batch:(k + 1) * args.batch],
                            y: labels[k * args.batch:(k + 1) * args.batch]})
    elapsed = time.perf_counter() - start
    print(f"images/sec: {args.timed * args.batch / elapsed:.1f}")
