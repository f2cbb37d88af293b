"""Small models written with raw tf.compat.v1 ops (no Keras layers)."""
from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from fastt.zoo import TrainingGraph, classifier, register

_tf1 = tf.compat.v1


def _device(devices: Sequence[str] | None, i: int) -> Any:
    return tf.device(devices[i % len(devices)]) if devices else tf.device(None)


def conv(x: Any, filters: int, size: int, name: str, stride: int = 1) -> Any:
    with _tf1.variable_scope(name):
        w = _tf1.get_variable("weights", [size, size, int(x.shape[-1]), filters])
        b = _tf1.get_variable("biases", [filters], initializer=_tf1.zeros_initializer())
        return tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w, stride, "SAME"), b))


def dense(x: Any, units: int, name: str, activation: bool = True) -> Any:
    with _tf1.variable_scope(name):
        w = _tf1.get_variable("weights", [int(x.shape[-1]), units])
        b = _tf1.get_variable("biases", [units], initializer=_tf1.zeros_initializer())
        y = tf.matmul(x, w) + b
        return tf.nn.relu(y) if activation else y


def flatten(x: Any) -> Any:
    return tf.reshape(x, [int(x.shape[0]), -1])


@register("small_cnn")
def small_cnn(batch_size: int = 16, image_size: int = 32, classes: int = 10, opt: str = "sgd",
              devices: Sequence[str] | None = None, seed: int = 0) -> TrainingGraph:
    """Three conv layers and a classifier; with ``devices``, layers round-robin over them."""
    def body(x: Any) -> Any:
        for i, f in enumerate((16, 32, 32)):
            with _device(devices, i):
                x = tf.nn.max_pool2d(conv(x, f, 3, f"conv{i + 1}"), 2, 2, "VALID")
        with _device(devices, 3):
            return dense(flatten(x), classes, "logits", activation=False)
    return classifier("small_cnn", body, (image_size, image_size, 3), classes, batch_size, opt,
                      seed)


@register("lenet")
def lenet(batch_size: int = 32, classes: int = 10, opt: str = "sgd",
          devices: Sequence[str] | None = None, seed: int = 0) -> TrainingGraph:
    """LeNet-5 on 28x28x1 inputs."""
    def body(x: Any) -> Any:
        with _device(devices, 0):
            x = tf.nn.max_pool2d(conv(x, 6, 5, "conv1"), 2, 2, "VALID")
        with _device(devices, 1):
            x = tf.nn.max_pool2d(conv(x, 16, 5, "conv2"), 2, 2, "VALID")
        with _device(devices, 2):
            x = dense(dense(flatten(x), 120, "fc3"), 84, "fc4")
            return dense(x, classes, "logits", activation=False)
    return classifier("lenet", body, (28, 28, 1), classes, batch_size, opt, seed)


@register("mlp")
def mlp(batch_size: int = 32, features: int = 64, hidden: Sequence[int] = (128, 128),
        classes: int = 10, opt: str = "sgd", devices: Sequence[str] | None = None,
        seed: int = 0) -> TrainingGraph:
    def body(x: Any) -> Any:
        for i, units in enumerate(hidden):
            with _device(devices, i):
                x = dense(x, units, f"fc{i + 1}")
        with _device(devices, len(hidden)):
            return dense(x, classes, "logits", activation=False)
    return classifier("mlp", body, (features,), classes, batch_size, opt, seed)
