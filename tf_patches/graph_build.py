"""Building large graphs at graph-mode speed under TensorFlow 2's tensor equality.

With tensor equality on (TensorFlow 2's default), hashing a variable first asks whether code
runs eagerly outside functions, which walks the graph stack. Legacy layers (tf-slim's batch
norm among them) hash every global variable each time they add one, so building ResNet-200
spends about 40% of its time there. Inside a ``tf.Graph`` that question's answer is no, and a
variable hashes and compares by identity either way: turning equality off while a graph is
built changes no op of it, only the time taken.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from tensorflow.python.framework import tensor as _tensor


@contextlib.contextmanager
def identity_equality() -> Iterator[None]:
    """Within this block tensors and variables compare by identity (TensorFlow 1's rule);
    the setting before it is restored after."""
    before = _tensor.Tensor._USE_EQUALITY
    _tensor.Tensor._USE_EQUALITY = False
    try:
        yield
    finally:
        _tensor.Tensor._USE_EQUALITY = before
