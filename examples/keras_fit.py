"""A tf-keras functional model trained with fit() in graph mode. Run it with FASTT=1 to let
fastt place it; nothing in it knows about fastt."""
import argparse
import random

import numpy as np
import tensorflow as tf
import tf_keras as keras

tf.compat.v1.disable_eager_execution()

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=15)
parser.add_argument("--batch", type=int, default=32)
args = parser.parse_args()

random.seed(0)
np.random.seed(0)
tf.compat.v1.set_random_seed(0)
images = np.random.rand(args.batch * 10, 28, 28, 1).astype(np.float32)
# ten classes by brightness rank: learnable, balanced
labels = np.argsort(np.argsort(images.mean(axis=(1, 2, 3)))) * 10 // len(images)

inputs = keras.Input(shape=(28, 28, 1))
h = keras.layers.Conv2D(16, 3, activation="relu")(inputs)
h = keras.layers.MaxPooling2D()(h)
h = keras.layers.Conv2D(32, 3, activation="relu")(h)
h = keras.layers.MaxPooling2D()(h)
h = keras.layers.Dense(64, activation="relu")(keras.layers.Flatten()(h))
outputs = keras.layers.Dense(10)(h)
model = keras.Model(inputs, outputs)
model.compile(optimizer=keras.optimizers.legacy.SGD(0.05, momentum=0.9),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(images, labels, batch_size=args.batch, epochs=args.epochs, shuffle=True,
                    verbose=0)
for epoch, value in enumerate(history.history["loss"]):
    print(f"epoch {epoch + 1}: loss {value:.6f}")
print(f"final loss: {model.evaluate(images, labels, batch_size=args.batch, verbose=0):.9g}")
