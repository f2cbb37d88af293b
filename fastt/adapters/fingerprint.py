"""What identifies a training graph for the plan cache: a digest of its GraphDef that changes
with its ops, their inputs, attributes and requested devices, and its integer constants (a
dataset's batch size, a reshape's shape), but not with the values of its other constants (a
learning rate, initial values) or the order its nodes were listed in. O(n) in its nodes."""
from __future__ import annotations

import hashlib
import math

from tensorflow.core.framework import graph_pb2, node_def_pb2, types_pb2

KEPT = (types_pb2.DT_INT32, types_pb2.DT_INT64)  # constants whose values shape the graph
KEPT_ELEMENTS = 64  # at most this many: a larger integer constant is data


def graph_digest(gd: graph_pb2.GraphDef) -> str:
    h = hashlib.sha256()
    for node in sorted(gd.node, key=lambda n: n.name):
        n = node_def_pb2.NodeDef()
        n.CopyFrom(node)
        if n.op == "Const" and "value" in n.attr:
            t = n.attr["value"].tensor
            size = math.prod(d.size for d in t.tensor_shape.dim)
            if t.dtype not in KEPT or size > KEPT_ELEMENTS:
                dtype, shape = t.dtype, type(t.tensor_shape)()
                shape.CopyFrom(t.tensor_shape)
                t.Clear()
                t.dtype = dtype
                t.tensor_shape.CopyFrom(shape)
        h.update(n.SerializeToString(deterministic=True))
    h.update(gd.library.SerializeToString(deterministic=True))
    return h.hexdigest()[:16]
