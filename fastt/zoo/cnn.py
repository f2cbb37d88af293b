"""Small models written with raw tf.compat.v1 ops (no Keras layers)."""
from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from fastt.errors import FasttError
from fastt.zoo import TrainingGraph, classifier, register

_tf1 = tf.compat.v1


def _device(devices: Sequence[str] | None, i: int) -> Any:
    return tf.device(devices[i % len(devices)]) if devices else tf.device(None)


def conv(x: Any, filters: int, size: int, name: str, stride: int = 1,
         batch_norm: bool = False) -> Any:
    with _tf1.variable_scope(name):
        w = _tf1.get_variable("weights", [size, size, int(x.shape[-1]), filters])
        y = tf.nn.conv2d(x, w, stride, "SAME")
        if batch_norm:
            return tf.nn.relu(_batch_norm(y))
        b = _tf1.get_variable("biases", [filters], initializer=_tf1.zeros_initializer())
        return tf.nn.relu(tf.nn.bias_add(y, b))


def _batch_norm(x: Any, decay: float = 0.9) -> Any:
    """Fused batch norm in training, its moving averages updated through ``UPDATE_OPS`` (the
    usual TF1 idiom)."""
    c = int(x.shape[-1])
    gamma = _tf1.get_variable("gamma", [c], initializer=_tf1.ones_initializer())
    beta = _tf1.get_variable("beta", [c], initializer=_tf1.zeros_initializer())
    y, mean, var = _tf1.nn.fused_batch_norm(x, gamma, beta, epsilon=1e-3, is_training=True)
    for stat, init in ((mean, _tf1.zeros_initializer()), (var, _tf1.ones_initializer())):
        avg = _tf1.get_variable(f"moving_{stat.op.name.rsplit('/', 1)[-1]}_{stat.value_index}",
                                [c], initializer=init, trainable=False)
        _tf1.add_to_collection(_tf1.GraphKeys.UPDATE_OPS,
                               _tf1.assign(avg, avg * decay + stat * (1 - decay)))
    return y


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
              devices: Sequence[str] | None = None, seed: int = 0,
              batch_norm: bool = False) -> TrainingGraph:
    """Three conv layers (with ``batch_norm``, each normalised in place of its bias) and a
    classifier; with ``devices``, layers round-robin over them."""
    def body(x: Any) -> Any:
        for i, f in enumerate((16, 32, 32)):
            with _device(devices, i):
                x = tf.nn.max_pool2d(conv(x, f, 3, f"conv{i + 1}", batch_norm=batch_norm),
                                     2, 2, "VALID")
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


@register("vgg_like")
def vgg_like(batch_size: int = 16, image_size: int = 32, widths: Sequence[int] = (32, 64, 128),
             convs_per_block: int = 2, fc: Sequence[int] = (), classes: int = 10,
             opt: str = "sgd", seed: int = 0) -> TrainingGraph:
    """VGG's pattern at small scale: blocks of 3x3 convolutions, each block ending in a 2x2
    max-pool, then the fully connected layers ``fc`` (none: a conv-only model with a linear
    classifier) and the classifier."""
    return _vgg("vgg_like", batch_size, image_size, widths, convs_per_block, fc, classes, opt,
                seed)


def _vgg(name: str, batch_size: int, image_size: int, widths: Sequence[int],
         convs_per_block: int, fc: Sequence[int], classes: int, opt: str,
         seed: int) -> TrainingGraph:
    if image_size % (2 ** len(widths)):
        raise FasttError(f"image_size {image_size} must be a multiple of {2 ** len(widths)} "
                         f"({len(widths)} pooling blocks)")

    def body(x: Any) -> Any:
        for b, width in enumerate(widths):
            for c in range(convs_per_block):
                x = conv(x, width, 3, f"conv{b + 1}_{c + 1}")
            x = tf.nn.max_pool2d(x, 2, 2, "VALID")
        x = flatten(x)
        for i, units in enumerate(fc):
            x = dense(x, units, f"fc{i + 1}")
        return dense(x, classes, "logits", activation=False)
    return classifier(name, body, (image_size, image_size, 3), classes, batch_size, opt, seed)


@register("vgg_mixed")
def vgg_mixed(batch_size: int = 16, image_size: int = 32, widths: Sequence[int] = (32, 64, 128),
              convs_per_block: int = 2, fc: Sequence[int] = (4096, 4096), classes: int = 10,
              opt: str = "sgd", seed: int = 0) -> TrainingGraph:
    """``vgg_like`` with large fully connected layers: a conv trunk that data parallelism
    speeds up, and parameters that make its gradient exchange expensive."""
    return _vgg("vgg_mixed", batch_size, image_size, widths, convs_per_block, fc, classes, opt,
                seed)


def inception_module(x: Any, width: int, name: str) -> Any:
    """Four parallel branches joined on channels: 1x1; 1x1 then 3x3; 1x1 then two 3x3 (a
    factorized 5x5); 3x3 max-pool then 1x1 (Inception-v3's pattern)."""
    with _tf1.variable_scope(name):
        a = conv(x, width, 1, "b1_1x1")
        b = conv(conv(x, width // 2, 1, "b2_1x1"), width, 3, "b2_3x3")
        c = conv(conv(conv(x, width // 2, 1, "b3_1x1"), width, 3, "b3_3x3a"), width, 3,
                 "b3_3x3b")
        d = conv(tf.nn.max_pool2d(x, 3, 1, "SAME"), width, 1, "b4_1x1")
        return tf.concat([a, b, c, d], axis=3)


@register("inception_like")
def inception_like(batch_size: int = 16, image_size: int = 32, modules: int = 3,
                   width: int = 32, classes: int = 10, opt: str = "sgd",
                   seed: int = 0) -> TrainingGraph:
    """A small Inception: a 3x3 stem, ``modules`` four-branch modules (a 2x2 max-pool after
    the first), global average pooling and the classifier."""
    if modules < 1 or width < 2:
        raise FasttError(f"inception_like needs modules >= 1 and width >= 2, got {modules}, "
                         f"{width}")

    def body(x: Any) -> Any:
        x = conv(x, width, 3, "stem")
        for m in range(modules):
            x = inception_module(x, width, f"mixed_{m + 1}")
            if m == 0:
                x = tf.nn.max_pool2d(x, 2, 2, "VALID")
        return dense(tf.reduce_mean(x, axis=[1, 2]), classes, "logits", activation=False)
    return classifier("inception_like", body, (image_size, image_size, 3), classes, batch_size,
                      opt, seed)
