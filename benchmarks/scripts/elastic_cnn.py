"""A small VGG-style CNN as TF1 tutorials wrote them: tf.layers convolutions and pooling, a
shuffled tf.data pipeline, Momentum, a global step, the loss printed at every step. On two
local workers data parallelism or a spread over both beats one worker, so the fault benchmark
can show a worker that comes back being used again. Nothing in it knows about fastt."""
import argparse
import time

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--batch", type=int, default=32)
args = parser.parse_args()

tf1.set_random_seed(1)
rng = np.random.RandomState(0)
n = args.batch * 8
images = rng.rand(n, 32, 32, 3).astype(np.float32)
labels = (images.mean(axis=(1, 2, 3)) * 10).astype(np.int64) % 10
dataset = (tf.data.Dataset.from_tensor_slices((images, labels))
           .shuffle(n, seed=1).repeat().batch(args.batch, drop_remainder=True))
x, y = tf1.data.make_one_shot_iterator(dataset).get_next()

h = x
for block, width in enumerate((32, 64, 128)):
    for k in range(2):
        h = tf1.layers.conv2d(h, width, 3, padding="same", activation=tf.nn.relu,
                              name=f"conv{block}_{k}")
    h = tf1.layers.max_pooling2d(h, 2, 2)
logits = tf1.layers.dense(tf1.layers.flatten(h), 10, name="logits")
loss = tf1.losses.sparse_softmax_cross_entropy(y, logits)
step = tf1.train.get_or_create_global_step()
train_op = tf1.train.MomentumOptimizer(0.01, 0.9).minimize(loss, global_step=step)

with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    for i in range(args.steps):
        _, value = sess.run([train_op, loss])
        print(f"step {i} loss {value:.9g} at {time.time():.3f}", flush=True)
print(f"final loss: {value:.9g}")
