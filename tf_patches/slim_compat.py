"""Let tf-slim 1.1 import under TensorFlow 2.16+ with tf_keras.

tf-slim's nets import ``tf_keras.legacy_tf_layers``, which tf_keras 2.16+ keeps at
``tf_keras.src.legacy_tf_layers``. Aliasing the module is enough.
"""
from __future__ import annotations

import importlib
import sys


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
