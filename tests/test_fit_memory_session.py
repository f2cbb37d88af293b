"""An unchanged script whose training step holds twice what TensorFlow's CPU allocator may
(``TF_CPU_ALLOCATOR_USE_BFC``, ``TF_CPU_BFC_MEM_LIMIT_IN_MB``): without fastt it fails with
TensorFlow's out-of-memory error; with ``FASTT=1`` it trains from its first step as gradient
accumulation, to the per-step losses of a run without a limit (within reassociation), and the
allocator's peak stays under the limit, with no allocation refused on the way. Each run is a
process of its own: TensorFlow reads the allocator's settings once, when it starts."""
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIMIT_MB = 100

SCRIPT = '''
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
tf1 = tf.compat.v1

batch = 16384
rng = np.random.RandomState(0)
X = rng.rand(batch * 2, 256).astype(np.float32)
Y = rng.randint(0, 10, size=batch * 2)
x = tf1.placeholder(tf.float32, [None, 256], name="x")
y = tf1.placeholder(tf.int64, [None], name="y")
h = x
for k, units in enumerate((1024, 1024)):
    h = tf1.layers.dense(h, units, activation=tf.nn.relu,
                         kernel_initializer=tf1.glorot_uniform_initializer(seed=k))
logits = tf1.layers.dense(h, 10, kernel_initializer=tf1.glorot_uniform_initializer(seed=9))
loss = tf1.losses.sparse_softmax_cross_entropy(y, logits)
train = tf1.train.MomentumOptimizer(0.05, 0.9).minimize(loss)
with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    for step in range(6):
        i = step % 2
        l, _ = sess.run([loss, train], {x: X[i*batch:(i+1)*batch], y: Y[i*batch:(i+1)*batch]})
        print(f"step {step} loss {l:.9f}")
    print("peak", tf.config.experimental.get_memory_info("CPU:0")["peak"])
'''


# batch norm in training normalises with the whole batch: the step is fitted by recomputation
BN_SCRIPT = '''
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
tf1 = tf.compat.v1

batch = 256
rng = np.random.RandomState(0)
X = rng.rand(batch * 2, 32, 32, 3).astype(np.float32)
Y = rng.randint(0, 10, size=batch * 2)
x = tf1.placeholder(tf.float32, [None, 32, 32, 3])
y = tf1.placeholder(tf.int64, [None])
h = x
for k, ch in enumerate((64, 64, 128, 128)):
    h = tf1.layers.conv2d(h, ch, 3, padding="same", use_bias=False,
                          kernel_initializer=tf1.glorot_uniform_initializer(seed=k))
    h = tf.nn.relu(tf1.layers.batch_normalization(h, training=True))
    if k % 2:
        h = tf1.layers.max_pooling2d(h, 2, 2)
logits = tf1.layers.dense(tf1.layers.flatten(h), 10,
                          kernel_initializer=tf1.glorot_uniform_initializer(seed=9))
loss = tf1.losses.sparse_softmax_cross_entropy(y, logits)
with tf1.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
    train = tf1.train.MomentumOptimizer(0.001, 0.9).minimize(loss)
with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    for step in range(4):
        i = step % 2
        l, _ = sess.run([loss, train], {x: X[i*batch:(i+1)*batch], y: Y[i*batch:(i+1)*batch]})
        print(f"step {step} loss {l:.9f}")
    print("peak", tf.config.experimental.get_memory_info("CPU:0")["peak"])
'''
BN_LIMIT_MB = 350


def run(tmp_path, limit_mb=None, fastt=False, script=SCRIPT):
    path = tmp_path / "script.py"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FASTT", "TF_CPU"))}
    # TensorFlow's warnings kept: its out-of-memory error is one
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="1", TF_USE_LEGACY_KERAS="1",
               TF_CPU_ALLOCATOR_USE_BFC="true", FASTT_CACHE="0")
    if limit_mb is not None:
        env["TF_CPU_BFC_MEM_LIMIT_IN_MB"] = str(limit_mb)
    if fastt:
        env["FASTT"] = "1"
    return subprocess.run([sys.executable, str(path)], env=env, capture_output=True,
                          text=True, timeout=600)


def losses(out):
    return [float(v) for v in re.findall(r"^step \d+ loss (\S+)$", out, re.M)]


def peak(out):
    return int(re.search(r"^peak (\d+)$", out, re.M).group(1))


def test_a_step_twice_over_the_cpu_allocators_limit_trains_fitted(tmp_path):
    free = run(tmp_path)
    assert free.returncode == 0, free.stderr[-3000:]
    assert peak(free.stdout) > 2 * LIMIT_MB * 2 ** 20  # the step holds twice the limit

    plain = run(tmp_path, LIMIT_MB)
    # TensorFlow's out-of-memory error (its oneDNN kernels may then crash the process)
    assert plain.returncode != 0 and "OOM when allocating" in plain.stderr
    assert "by allocator bfc_cpu_allocator" in plain.stderr

    fitted = run(tmp_path, LIMIT_MB, fastt=True)
    assert fitted.returncode == 0, fitted.stderr[-3000:]
    said = fitted.stderr
    assert re.search(r"fastt: the training step would hold [\d.]+ MiB on \S+CPU:0, more than "
                     rf"the {LIMIT_MB}\.0 MiB TensorFlow lets it hold; it runs with its batch "
                     r"as \d+ micro-batches in turn, gradients summed and applied once",
                     said), said[-3000:]
    assert "OOM when allocating" not in said
    want, got = losses(free.stdout), losses(fitted.stdout)
    assert len(want) == len(got) == 6
    assert got == pytest.approx(want, rel=1e-5)  # per step, up to reassociation
    assert peak(fitted.stdout) < LIMIT_MB * 2 ** 20


def test_a_batch_norm_step_over_the_limit_trains_recomputed_bit_for_bit(tmp_path):
    free = run(tmp_path, script=BN_SCRIPT)
    assert free.returncode == 0, free.stderr[-3000:]
    # a third over the limit (the allocator's peak varies with the CPU's kernels): without
    # fastt, TensorFlow's out-of-memory error
    assert peak(free.stdout) > 1.3 * BN_LIMIT_MB * 2 ** 20
    plain = run(tmp_path, BN_LIMIT_MB, script=BN_SCRIPT)
    assert plain.returncode != 0 and "OOM when allocating" in plain.stderr
    fitted = run(tmp_path, BN_LIMIT_MB, fastt=True, script=BN_SCRIPT)
    assert fitted.returncode == 0, fitted.stderr[-3000:]
    assert re.search(r"it runs with \d+ forward ops recomputed in the backward pass",
                     fitted.stderr), fitted.stderr[-3000:]
    assert "OOM when allocating" not in fitted.stderr
    want, got = losses(free.stdout), losses(fitted.stdout)
    assert len(got) == 4 and got == want  # the same kernels on the same values
    assert peak(fitted.stdout) < BN_LIMIT_MB * 2 ** 20


KERAS_BN_SCRIPT = '''
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
import tf_keras as keras
from tf_keras import layers, initializers
rng = np.random.RandomState(0)
X = rng.rand(512, 32, 32, 3).astype(np.float32)
Y = rng.randint(0, 10, size=512)
model = keras.Sequential([keras.Input((32, 32, 3))])
for k, ch in enumerate((64, 64, 128, 128)):
    model.add(layers.Conv2D(ch, 3, padding="same", use_bias=False,
                            kernel_initializer=initializers.GlorotUniform(seed=k)))
    model.add(layers.BatchNormalization())
    model.add(layers.ReLU())
    if k % 2:
        model.add(layers.MaxPooling2D())
model.add(layers.Flatten())
model.add(layers.Dense(10, kernel_initializer=initializers.GlorotUniform(seed=9)))
model.compile(keras.optimizers.legacy.SGD(0.001, momentum=0.9),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

class Print(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        print(f"step {batch} loss {logs['loss']:.9f}")

model.fit(X, Y, batch_size=256, epochs=2, shuffle=False, verbose=0, callbacks=[Print()])
print("peak", tf.config.experimental.get_memory_info("CPU:0")["peak"])
'''


def test_a_keras_batch_norm_model_over_the_limit_fits_with_its_conds_shapes_filled(tmp_path):
    """tf-keras' batch norm is a functional ``If`` whose output shapes leave the batch
    unknown: the step's memory is still known before it runs, and it trains recomputed."""
    limit = 350
    free = run(tmp_path, script=KERAS_BN_SCRIPT)
    assert free.returncode == 0, free.stderr[-3000:]
    assert peak(free.stdout) > 1.25 * limit * 2 ** 20
    fitted = run(tmp_path, limit, fastt=True, script=KERAS_BN_SCRIPT)
    assert fitted.returncode == 0, fitted.stderr[-3000:]
    assert "forward ops recomputed in the backward pass" in fitted.stderr
    assert "OOM when allocating" not in fitted.stderr
    assert losses(fitted.stdout) == losses(free.stdout) and len(losses(free.stdout)) == 4
    assert peak(fitted.stdout) < limit * 2 ** 20
