"""tf-slim 1.1 under TensorFlow 2.16+ with tf_keras, and its nets on small images.

tf-slim's nets import ``tf_keras.legacy_tf_layers``, which tf_keras 2.16+ keeps at
``tf_keras.src.legacy_tf_layers``: ``install`` aliases the module. ``small_inputs`` lets VGG
and AlexNet build for images smaller than 224x224.
"""
from __future__ import annotations

import contextlib
import importlib
import sys
from typing import Any, Iterator


def install() -> bool:
    """Alias ``tf_keras.legacy_tf_layers``; False when tf_keras is not installed."""
    if "tf_keras.legacy_tf_layers" in sys.modules:
        return True
    try:
        legacy = importlib.import_module("tf_keras.src.legacy_tf_layers")
    except ImportError:
        return False
    sys.modules["tf_keras.legacy_tf_layers"] = legacy
    for sub in ("base", "core", "convolutional", "normalization", "pooling", "variable_scope_shim"):
        try:
            sys.modules[f"tf_keras.legacy_tf_layers.{sub}"] = importlib.import_module(
                f"tf_keras.src.legacy_tf_layers.{sub}")
        except ImportError:
            pass
    return True


@contextlib.contextmanager
def small_inputs() -> Iterator[None]:
    """While building a tf-slim net, its VALID convolutions whose kernel is larger than their
    input (VGG's and AlexNet's fully connected layers, written as 7x7 and 5x5 convolutions
    sized for 224x224 images) take a kernel of the input's size, so the nets build for small
    images: still fully connected layers, with weights sized for those images (a 7x7 kernel
    over a 1x1 map would hold 49 times the weights and use one tap). Every other layer is
    unchanged."""
    import tf_slim.layers as slim_layers

    original = slim_layers.conv2d

    def conv2d(inputs: Any, num_outputs: Any, kernel_size: Any, *args: Any, **kwargs: Any) -> Any:
        k = kernel_size if isinstance(kernel_size, (list, tuple)) else (kernel_size,) * 2
        h, w = inputs.shape[1], inputs.shape[2]
        if kwargs.get("padding") == "VALID" and h is not None and w is not None \
                and (k[0] > h or k[1] > w):
            kernel_size = [min(k[0], h), min(k[1], w)]
        return original(inputs, num_outputs, kernel_size, *args, **kwargs)

    # arg_scope finds a layer's default arguments under this key: keep the original's.
    conv2d._key_op = getattr(original, "_key_op", str(original))  # type: ignore[attr-defined]
    slim_layers.conv2d = conv2d
    try:
        yield
    finally:
        slim_layers.conv2d = original
