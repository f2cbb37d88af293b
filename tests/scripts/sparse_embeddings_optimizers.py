"""Token embeddings (``tf.nn.embedding_lookup``: sparse gradients) trained by each TF1
optimizer's sparse update: SGD, Momentum, Adam, Adagrad, RMSProp and FTRL, one table each,
in one training step."""
import argparse
import os
import random

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="sparse_embeddings_optimizers")
args = parser.parse_args()

random.seed(29)
np.random.seed(29)
tf1.set_random_seed(29)
rng = np.random.RandomState(29)
tokens = rng.randint(0, 40, (512, 12)).astype(np.int32)
labels = (tokens[:, 0] % 3).astype(np.int64)

t = tf1.placeholder(tf.int32, [None, 12], name="tokens")
y = tf1.placeholder(tf.int64, [None], name="labels")
optimizers = {"sgd": tf1.train.GradientDescentOptimizer(0.5),
              "momentum": tf1.train.MomentumOptimizer(0.1, 0.9),
              "adam": tf1.train.AdamOptimizer(0.01),
              "adagrad": tf1.train.AdagradOptimizer(0.3),
              "rmsprop": tf1.train.RMSPropOptimizer(0.01),
              "ftrl": tf1.train.FtrlOptimizer(0.3)}
tables = {k: tf1.get_variable(f"emb_{k}", [40, 8]) for k in optimizers}
features = tf.add_n([tf.reduce_mean(tf.nn.embedding_lookup(e, t), 1) for e in tables.values()])
logits = tf1.layers.dense(features, 3, name="out")
loss = tf1.losses.sparse_softmax_cross_entropy(y, logits)
head = tf1.trainable_variables("out")
train = tf.group(*[opt.minimize(loss, var_list=[tables[k]] + (head if k == "sgd" else []))
                   for k, opt in optimizers.items()])
saver = tf1.train.Saver()

with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    for i in range(100):
        k = i % 16
        _, value = sess.run([train, loss], {t: tokens[k * 32:(k + 1) * 32],
                                            y: labels[k * 32:(k + 1) * 32]})
        print(f"step {i + 1}: loss {value:.6f}")
    os.makedirs(args.out, exist_ok=True)
    print("checkpoint:", saver.save(sess, os.path.join(args.out, "model.ckpt")))
    print("final loss:", value)
