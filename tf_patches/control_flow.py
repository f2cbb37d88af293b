"""Whether an op of a graph runs inside TF1 control flow (``tf.cond``, ``tf.while_loop``):
TensorFlow keeps that in a private attribute of the op, with no public accessor."""
from __future__ import annotations

from typing import Any


def in_control_flow(op: Any) -> bool:
    return op._get_control_flow_context() is not None
