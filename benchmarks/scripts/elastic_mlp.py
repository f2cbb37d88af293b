"""A TF1 training script as tutorials wrote them: a shuffled tf.data pipeline, dropout, Adam,
a global step, a Saver every 50 steps, the loss printed at every step. Nothing in it knows
about fastt; the fault benchmark and the cluster tests kill its workers while it trains."""
import argparse
import os
import time

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--batch", type=int, default=128)
parser.add_argument("--width", type=int, default=1024)
parser.add_argument("--out", default="/tmp/elastic_mlp")
args = parser.parse_args()

tf1.set_random_seed(1)
rng = np.random.RandomState(0)
n = args.batch * 16
features = rng.rand(n, 256).astype(np.float32)
labels = (features[:, :128].sum(axis=1) > features[:, 128:].sum(axis=1)).astype(np.int64)

dataset = (tf.data.Dataset.from_tensor_slices((features, labels))
           .shuffle(n, seed=1).repeat().batch(args.batch, drop_remainder=True))
x, y = tf1.data.make_one_shot_iterator(dataset).get_next()


def dense(h, units, name):
    with tf1.variable_scope(name):
        w = tf1.get_variable("kernel", [h.shape[-1], units])
        b = tf1.get_variable("bias", [units], initializer=tf1.zeros_initializer())
        return tf.matmul(h, w) + b


h = x
for i in range(3):
    h = tf.nn.dropout(tf.nn.relu(dense(h, args.width, f"hidden{i}")), rate=0.1, seed=i + 1)
logits = dense(h, 2, "logits")
loss = tf1.losses.sparse_softmax_cross_entropy(y, logits)
step = tf1.train.get_or_create_global_step()
train_op = tf1.train.AdamOptimizer(1e-3).minimize(loss, global_step=step)
saver = tf1.train.Saver(max_to_keep=3)

os.makedirs(args.out, exist_ok=True)
with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    for i in range(args.steps):
        _, value = sess.run([train_op, loss])
        print(f"step {i} loss {value:.9g} at {time.time():.3f}", flush=True)
        if (i + 1) % 50 == 0:
            saver.save(sess, os.path.join(args.out, "model"), global_step=step)
print(f"final loss: {value:.9g}")
