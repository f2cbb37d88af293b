"""Keras 2 transfer learning in graph mode: train, freeze the first layers, compile again
with another optimizer and train again, then evaluate (metrics' variables made at each
compile)."""
import argparse
import os
import random

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()
keras = tf.keras
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="keras_transfer_recompile")
args = parser.parse_args()

random.seed(5)
np.random.seed(5)
tf.compat.v1.set_random_seed(5)
rng = np.random.RandomState(5)
xs = rng.rand(271, 16).astype(np.float32)  # the epochs end on a smaller batch
ys = (xs[:, :5] * 2.0).argmax(axis=1)

model = keras.Sequential([
    keras.layers.Dense(32, activation="relu", input_shape=(16,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(5),
])
model.compile(keras.optimizers.legacy.SGD(0.1),
              keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
h1 = model.fit(xs, ys, batch_size=128, epochs=30, shuffle=False, verbose=0)
for layer in model.layers[:2]:
    layer.trainable = False
model.compile(keras.optimizers.legacy.Adam(1e-3),
              keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
h2 = model.fit(xs, ys, batch_size=128, epochs=15, shuffle=False, verbose=0)
for i, v in enumerate(h1.history["loss"] + h2.history["loss"]):
    print(f"epoch {i}: loss {v:.6f}")
loss, acc = model.evaluate(xs, ys, batch_size=32, verbose=0)
print(f"test accuracy {acc:.4f}")
os.makedirs(args.out, exist_ok=True)
path = os.path.join(args.out, "weights.ckpt")
model.save_weights(path, save_format="tf")
print("checkpoint:", path)
print("final loss:", loss)
