"""MonitoredTrainingSession with hooks (StopAtStepHook, LoggingTensorHook, NanTensorHook),
a tf.data pipeline, a global step and checkpoints in checkpoint_dir."""
import argparse
import random

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
tf1.disable_eager_execution()
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="/tmp/monitored_hooks")
args = parser.parse_args()

random.seed(7)  # tf.layers draws its initializers' seeds from Python's random
np.random.seed(7)
tf1.set_random_seed(7)
rng = np.random.RandomState(7)
features = rng.rand(800, 10).astype(np.float32)
targets = (features @ rng.rand(10, 1)).astype(np.float32)
ds = tf.data.Dataset.from_tensor_slices((features, targets)).shuffle(800, seed=7).repeat()
x, y = tf1.data.make_one_shot_iterator(ds.batch(40)).get_next()
h = tf1.layers.dense(x, 24, activation=tf.nn.relu)
pred = tf1.layers.dense(h, 1)
loss = tf1.losses.mean_squared_error(y, pred)
global_step = tf1.train.get_or_create_global_step()
train_op = tf1.train.AdagradOptimizer(0.1).minimize(loss, global_step=global_step)
hooks = [tf1.train.StopAtStepHook(last_step=150), tf1.train.NanTensorHook(loss),
         tf1.train.LoggingTensorHook({"loss": loss, "step": global_step}, every_n_iter=50)]
with tf1.train.MonitoredTrainingSession(checkpoint_dir=args.out, hooks=hooks,
                                        save_checkpoint_steps=75, log_step_count_steps=None,
                                        save_summaries_steps=None) as sess:
    while not sess.should_stop():
        _, value = sess.run([train_op, loss])
print("checkpoint:", tf1.train.latest_checkpoint(args.out))
print("final loss:", value)
