"""A tf-slim model trained with slim.learning.train. Run it with FASTT=1 to let fastt place it;
nothing in it knows about fastt."""
import argparse
import tempfile

import numpy as np
import tensorflow as tf
import tf_slim as slim

tf1 = tf.compat.v1
tf1.disable_eager_execution()

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=150)
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--out", help="checkpoint directory (default: a new private "
                    "temporary directory)")
args = parser.parse_args()
out = args.out or tempfile.mkdtemp(prefix="fastt-example-slim-")

tf1.set_random_seed(0)
rng = np.random.RandomState(0)
pixels = rng.rand(args.batch * 4, 32, 32, 3).astype(np.float32)
# ten classes by brightness rank: learnable, balanced
data = (pixels, np.argsort(np.argsort(pixels.mean(axis=(1, 2, 3)))) * 10 // len(pixels))
dataset = tf.data.Dataset.from_tensor_slices(data).repeat().batch(args.batch, drop_remainder=True)
images, labels = tf1.data.make_one_shot_iterator(dataset).get_next()

with slim.arg_scope([slim.conv2d, slim.fully_connected], activation_fn=tf.nn.relu,
                    weights_regularizer=slim.l2_regularizer(1e-4)):
    net = slim.conv2d(images, 32, [3, 3], scope="conv1")
    net = slim.max_pool2d(net, [2, 2], scope="pool1")
    net = slim.conv2d(net, 64, [3, 3], scope="conv2")
    net = slim.max_pool2d(net, [2, 2], scope="pool2")
    net = slim.fully_connected(slim.flatten(net), 128, scope="fc3")
    logits = slim.fully_connected(net, 10, activation_fn=None, scope="logits")
tf1.losses.sparse_softmax_cross_entropy(labels, logits)
total_loss = tf1.losses.get_total_loss()
train_op = slim.learning.create_train_op(total_loss, tf1.train.MomentumOptimizer(0.01, 0.9))
final = slim.learning.train(train_op, out, number_of_steps=args.steps,
                            save_summaries_secs=100000, save_interval_secs=100000,
                            log_every_n_steps=20)
print(f"checkpoints: {out}")
print(f"final loss: {final:.9g}")
