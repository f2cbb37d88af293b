"""tf.compat.v1.train.Supervisor with a logdir and managed_session, a global step, a
learning-rate placeholder fed each step, the final checkpoint saved by the Supervisor."""
import argparse
import random

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="/tmp/supervisor")
args = parser.parse_args()

rng = np.random.RandomState(17)
xs = rng.rand(320, 12).astype(np.float32)
ys = (xs.sum(axis=1, keepdims=True) > 6).astype(np.float32)
graph = tf.Graph()
with graph.as_default():
    random.seed(17)  # tf.layers draws its initializers' seeds from Python's random
    np.random.seed(17)
    tf1.set_random_seed(17)
    x = tf1.placeholder(tf.float32, [None, 12])
    y = tf1.placeholder(tf.float32, [None, 1])
    lr = tf1.placeholder(tf.float32, [], name="learning_rate")
    h = tf1.layers.dense(x, 20, activation=tf.nn.sigmoid)
    out = tf1.layers.dense(h, 1)
    loss = tf1.losses.sigmoid_cross_entropy(y, out)
    global_step = tf1.train.get_or_create_global_step()
    train = tf1.train.GradientDescentOptimizer(lr).minimize(loss, global_step=global_step)
    sv = tf1.train.Supervisor(logdir=args.out, save_model_secs=0, save_summaries_secs=0)
    with sv.managed_session() as sess:
        for i in range(150):
            if sv.should_stop():
                break
            k = i % 10
            _, value = sess.run([train, loss], {x: xs[k * 32:(k + 1) * 32],
                                                y: ys[k * 32:(k + 1) * 32],
                                                lr: 0.5 if i < 100 else 0.1})
        sv.saver.save(sess, sv.save_path, global_step=global_step)
    print("checkpoint:", tf1.train.latest_checkpoint(args.out))
    print("final loss:", value)
