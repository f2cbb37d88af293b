"""Keras 2 style on tf-keras in graph mode: a Sequential model, compile, fit with
validation_data, a callback that records the validation loss, evaluate, save_weights in the
TensorFlow checkpoint format."""
import argparse
import os
import random

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()
keras = tf.keras
parser = argparse.ArgumentParser()
parser.add_argument("--out", default="/tmp/keras_fit_validation")
args = parser.parse_args()

random.seed(19)
np.random.seed(19)
tf.compat.v1.set_random_seed(19)
x_train = np.random.rand(960, 16).astype("float32")
y_train = (x_train[:, :4].sum(axis=1) > 2).astype("float32")
x_val, y_val = x_train[:200], y_train[:200]


class History(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        print(f"epoch {epoch + 1}: val_loss {logs['val_loss']:.6f}")


model = keras.Sequential([keras.layers.Dense(32, activation="relu", input_shape=(16,)),
                          keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(optimizer=keras.optimizers.legacy.SGD(0.1, momentum=0.9), loss="binary_crossentropy",
              metrics=["accuracy"])
hist = model.fit(x_train, y_train, batch_size=64, epochs=8, shuffle=False, verbose=0,
                 validation_data=(x_val, y_val), callbacks=[History()])
loss, acc = model.evaluate(x_val, y_val, batch_size=100, verbose=0)
print(f"evaluate: loss {loss:.6f}")
os.makedirs(args.out, exist_ok=True)
path = os.path.join(args.out, "weights.ckpt")
model.save_weights(path, save_format="tf")
print("checkpoint:", path)
print("final loss:", hist.history["loss"][-1])
