"""A TF1 training script with a tf.data pipeline, a global step and MonitoredTrainingSession.
Run it with FASTT=1 to let fastt place it; nothing in it knows about fastt."""
import argparse
import hashlib
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
out = args.out or tempfile.mkdtemp(prefix="fastt-example-monitored-")

tf1.set_random_seed(0)
rng = np.random.RandomState(0)
n = args.batch * 40
features = rng.rand(n, 64).astype(np.float32)
targets = (features @ rng.rand(64, 1) + 0.1 * rng.rand(n, 1)).astype(np.float32)

dataset = (tf.data.Dataset.from_tensor_slices((np.arange(n), features, targets))
           .shuffle(n, seed=1).repeat().batch(args.batch, drop_remainder=True))
index, x, y = tf1.data.make_one_shot_iterator(dataset).get_next()

h = x
for i, units in enumerate([256, 256, 1]):
    with tf1.variable_scope(f"dense{i}"):
        w = tf1.get_variable("kernel", [h.shape[-1], units])
        b = tf1.get_variable("bias", [units], initializer=tf1.zeros_initializer())
        h = tf.matmul(h, w) + b
        if units > 1:
            h = tf.nn.relu(h)
loss = tf.reduce_mean(tf.square(h - y))
step = tf1.train.get_or_create_global_step()
train_op = tf1.train.AdamOptimizer(1e-3).minimize(loss, global_step=step)

seen = []
hooks = [tf1.train.StopAtStepHook(last_step=args.steps)]
with tf1.train.MonitoredTrainingSession(checkpoint_dir=out, hooks=hooks,
                                        save_summaries_steps=None,
                                        log_step_count_steps=None) as sess:
    while not sess.should_stop():
        _, value, ids, g = sess.run([train_op, loss, index, step])
        seen.extend(ids.tolist())
        if g % 20 == 0:
            print(f"step {g}: loss {value:.6f}", flush=True)
digest = hashlib.sha1(np.array(seen, dtype=np.int64).tobytes()).hexdigest()
print(f"samples: {len(seen)} seen, {len(set(seen))} distinct, order {digest}")
print(f"checkpoints: {out}")
print(f"final loss: {value:.9g}")
