"""The anchor for data parallelism: TensorFlow's own MultiWorkerMirroredStrategy, two worker
processes on 127.0.0.1, one core each, training the real testbed's models as its
documentation shows (tf-keras ``Model.fit`` under ``strategy.scope()``, ``TF_CONFIG`` per
worker, a ``tf.data`` dataset of the global batch).

    python benchmarks/mwms.py [--models NAME ...] [--repeats R] [--steps S]

Each model is the same network as the real testbed's zoo graph (``fastt.zoo``: the same
layers, shapes, loss, and optimizer at 0.01), written with tf-keras layers; the global batch is the
testbed's batch, so each worker computes half of it, as in fastt's data parallelism. The chief
times R blocks of S steps (after a warm-up of S steps) and reports the median
samples/second. ``benchmarks/real.py`` calls ``measure`` for its ``mwms`` column. Models with
no tf-keras version here would be skipped (listed in ``SKIPPED``; none is).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import models as zoo_models  # noqa: E402

from fastt.cluster.local import HOST, free_ports  # noqa: E402

SKIPPED: dict[str, str] = {}


def keras_model(model: zoo_models.Model):  # type: ignore[no-untyped-def]
    """The zoo model as a tf-keras model (logits out)."""
    import tensorflow as tf
    k = tf.keras.layers
    kw = model.kwargs

    def conv(f: int, s: int) -> object:
        return k.Conv2D(f, s, padding="same", activation="relu")

    if model.zoo_name == "lenet":
        layers = [k.Input((28, 28, 1)), conv(6, 5), k.MaxPool2D(2), conv(16, 5), k.MaxPool2D(2),
                  k.Flatten(), k.Dense(120, activation="relu"), k.Dense(84, activation="relu"),
                  k.Dense(10)]
        return tf.keras.Sequential(layers)
    size = kw.get("image_size", 32)
    if model.zoo_name in ("vgg_like", "vgg_mixed"):
        widths = kw.get("widths", (32, 64, 128))
        fc = kw.get("fc", (4096, 4096) if model.zoo_name == "vgg_mixed" else ())
        layers = [k.Input((size, size, 3))]
        for w in widths:
            layers += [conv(w, 3), conv(w, 3), k.MaxPool2D(2)]
        layers += [k.Flatten()] + [k.Dense(u, activation="relu") for u in fc] + [k.Dense(10)]
        return tf.keras.Sequential(layers)
    if model.zoo_name == "inception_like":
        width = kw.get("width", 32)
        x = inp = k.Input((size, size, 3))
        x = conv(width, 3)(x)
        for m in range(kw.get("modules", 3)):
            a = conv(width, 1)(x)
            b = conv(width, 3)(conv(width // 2, 1)(x))
            c = conv(width, 3)(conv(width, 3)(conv(width // 2, 1)(x)))
            d = conv(width, 1)(k.MaxPool2D(3, 1, padding="same")(x))
            x = k.Concatenate()([a, b, c, d])
            if m == 0:
                x = k.MaxPool2D(2)(x)
        return tf.keras.Model(inp, k.Dense(10)(k.GlobalAveragePooling2D()(x)))
    if model.zoo_name == "alexnet_v2":  # slim's alexnet_v2: fc6-fc8 as convolutions
        layers = [k.Input((size, size, 3)), k.Conv2D(64, 11, 4, activation="relu"),
                  k.MaxPool2D(3, 2), conv(192, 5), k.MaxPool2D(3, 2), conv(384, 3),
                  conv(384, 3), conv(256, 3), k.MaxPool2D(3, 2)]
        fc = 5 if size >= 224 else 1  # the zoo's fc6 kernel covers what pool5 leaves
        layers += [k.Conv2D(4096, fc, activation="relu"), k.Dropout(0.5),
                   k.Conv2D(4096, 1, activation="relu"), k.Dropout(0.5), k.Conv2D(10, 1),
                   k.Flatten()]
        return tf.keras.Sequential(layers)
    return _sequence_model(model)


def _sequence_model(model: zoo_models.Model):  # type: ignore[no-untyped-def]
    """The zoo's Transformer encoder and LSTM language model in tf-keras (per-token
    logits)."""
    import math

    import tensorflow as tf

    from fastt.zoo.nlp import positional_encoding
    k = tf.keras.layers
    kw = model.kwargs
    tokens = k.Input((kw["seq_len"],), dtype="int32")
    if model.zoo_name == "transformer":
        d = kw["d_model"]
        pe = tf.constant(positional_encoding(kw["seq_len"], d), tf.float32)
        x = k.Lambda(lambda t: t * math.sqrt(d) + pe)(k.Embedding(kw["vocab"], d)(tokens))
        for _ in range(kw["layers"]):
            a = k.MultiHeadAttention(kw["heads"], d // kw["heads"])(x, x)
            x = k.LayerNormalization(epsilon=1e-6)(k.Add()([x, a]))
            f = k.Dense(d)(k.Dense(kw["d_ff"], activation="relu")(x))
            x = k.LayerNormalization(epsilon=1e-6)(k.Add()([x, f]))
    elif model.zoo_name == "lstm_lm":
        x = k.Embedding(kw["vocab"], kw["hidden"])(tokens)
        for _ in range(kw["layers"]):  # unrolled, as the zoo's graph is
            x = k.LSTM(kw["hidden"], return_sequences=True, unroll=True)(x)
    else:
        raise KeyError(model.name)
    return tf.keras.Model(tokens, k.Dense(kw["vocab"])(x))


def _optimizer(model: zoo_models.Model):  # type: ignore[no-untyped-def]
    """The zoo's default optimizer of the model, at its learning rate (0.01)."""
    import tensorflow as tf
    if model.zoo_name == "transformer":
        return tf.keras.optimizers.Adam(0.01)
    if model.zoo_name.startswith(("alexnet", "vgg_", "resnet", "inception_v")):
        return tf.keras.optimizers.SGD(0.01, momentum=0.9)  # slim nets: momentum
    return tf.keras.optimizers.SGD(0.01)


def _sample(model: zoo_models.Model, net, rows: int):  # type: ignore[no-untyped-def]
    """Random inputs and labels of ``rows`` examples (tokens and next tokens for the
    sequence models)."""
    import numpy as np
    rng = np.random.RandomState(0)
    shape = net.input_shape[1:]
    if "vocab" in model.kwargs:
        vocab = model.kwargs["vocab"]
        return (rng.randint(0, vocab, (rows, *shape)).astype(np.int32),
                rng.randint(0, vocab, (rows, *shape)).astype(np.int32))
    return (rng.rand(rows, *shape).astype(np.float32),
            rng.randint(0, 10, rows).astype(np.int32))


def worker(name: str, steps: int, repeats: int) -> None:
    """One worker of the strategy (``TF_CONFIG`` set by ``measure``)."""
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    model = {m.name: m for m in zoo_models.REAL}[name]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        net = keras_model(model)
        net.compile(optimizer=_optimizer(model),
                    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _sample(model, net, 4 * model.batch)
    # the global batch: the strategy gives each worker its half
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(model.batch)
    times: list[float] = []

    class Blocks(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):  # type: ignore[no-untyped-def]
            self.t = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):  # type: ignore[no-untyped-def]
            times.append((time.perf_counter() - self.t) / steps)

    net.fit(data, epochs=repeats + 1, steps_per_epoch=steps, verbose=0, callbacks=[Blocks()])
    if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0:
        print("MWMS " + json.dumps({"model": name, "block_s": times[1:]}), flush=True)


def measure(model: zoo_models.Model, steps: int, repeats: int) -> dict | None:
    """Median step time and samples/s of ``model`` under MultiWorkerMirroredStrategy on two
    one-core workers (None when it has no tf-keras version here)."""
    if model.name in SKIPPED:
        return None
    ports = free_ports(2)
    cluster = {"worker": [f"{HOST}:{p}" for p in ports]}
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    procs = []
    cores = sorted(os.sched_getaffinity(0))
    try:
        for i in range(2):
            env_i = dict(env, TF_CONFIG=json.dumps({"cluster": cluster,
                                                    "task": {"type": "worker", "index": i}}))
            core = {cores[i % len(cores)]}
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", model.name, "--steps", str(steps),
                 "--repeats", str(repeats)], env=env_i, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True,
                preexec_fn=lambda c=core: os.sched_setaffinity(0, c)))  # type: ignore[misc]
        out, err = procs[0].communicate(timeout=1800)
        procs[1].wait(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    line = next((x for x in out.splitlines() if x.startswith("MWMS ")), None)
    if line is None:
        raise RuntimeError(f"MultiWorkerMirroredStrategy run of {model.name} failed: "
                           f"{err[-3000:]}")
    blocks = json.loads(line[5:])["block_s"]
    step = statistics.median(blocks)
    return {"step_s": step, "samples_per_s": model.batch / step, "block_s": blocks}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.repeats)
        return 0
    for model in zoo_models.pick(zoo_models.REAL, args.models):
        r = measure(model, args.steps, args.repeats)
        print(f"{model.name}: " + (f"{r['samples_per_s']:.1f} samples/s "
                                   f"({1e3 * r['step_s']:.1f} ms/step)" if r else
                                   f"skipped: {SKIPPED[model.name]}"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
