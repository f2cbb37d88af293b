"""IR graphs back to TensorFlow ``GraphDef``s, including the ops fastt's passes created.

Ops read from TensorFlow carry their NodeDef and are written back with the IR's name, inputs,
device and colocation. Ops fastt made have no NodeDef and are synthesised from their type and
attributes: ``SplitV`` (cut along ``axis`` into ``size_splits``), ``ConcatV2`` and ``AddN``
joins, integer ``Const`` vectors (per-part shapes, folded shape queries) and ``IdentityN``.
Sub-ops ``X/part{k}`` reuse X's NodeDef under their own name.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2

from fastt.errors import FasttError
from fastt.ir import Graph, Op

_STALE_ATTRS = ("_class", "_output_shapes")


def _enum(dtype: str) -> int:
    return tf.as_dtype(dtype.removesuffix("_ref")).as_datatype_enum


def _input_names(op: Op) -> list[str]:
    return [r.op if r.index == 0 else f"{r.op}:{r.index}" for r in op.inputs] + \
        ["^" + c for c in op.control_inputs]


def _const(name: str, value: object, dtype: str, device: str) -> node_def_pb2.NodeDef:
    node = node_def_pb2.NodeDef(name=name, op="Const", device=device)
    node.attr["dtype"].type = _enum(dtype)
    node.attr["value"].tensor.CopyFrom(
        tf.make_tensor_proto(np.asarray(value, dtype=tf.as_dtype(dtype).as_numpy_dtype)))
    return node


def _synthesise(op: Op) -> list[node_def_pb2.NodeDef]:
    """NodeDefs for an op fastt created (with helper constants where TensorFlow needs them)."""
    dev = op.device
    if op.type == "Const":
        return [_const(op.name, op.attrs["value"], op.outputs[0].dtype, dev)]
    node = node_def_pb2.NodeDef(name=op.name, op=op.type, device=dev)
    node.input.extend(_input_names(op))
    extra: list[node_def_pb2.NodeDef] = []
    if op.type == "SplitV":
        node.input.insert(1, f"{op.name}/size_splits")
        node.input.insert(2, f"{op.name}/axis")
        extra = [_const(f"{op.name}/size_splits", op.attrs["size_splits"], "int32", dev),
                 _const(f"{op.name}/axis", op.attrs["axis"], "int32", dev)]
        node.attr["num_split"].i = len(op.attrs["size_splits"])
        node.attr["T"].type = _enum(op.outputs[0].dtype)
        node.attr["Tlen"].type = _enum("int32")
    elif op.type == "ConcatV2":
        node.input.insert(len(op.inputs), f"{op.name}/axis")
        extra = [_const(f"{op.name}/axis", op.attrs["axis"], "int32", dev)]
        node.attr["N"].i = len(op.inputs)
        node.attr["T"].type = _enum(op.outputs[0].dtype)
        node.attr["Tidx"].type = _enum("int32")
    elif op.type == "AddN":
        node.attr["N"].i = len(op.inputs)
        node.attr["T"].type = _enum(op.outputs[0].dtype)
    elif op.type == "IdentityN":
        node.attr["T"].list.type.extend(_enum(t.dtype) for t in op.outputs)
    else:
        raise FasttError(f"cannot write op {op.name!r}: no TensorFlow definition for a "
                         f"{op.type!r} made by fastt")
    return extra + [node]


def to_graph_def(graph: Graph, placement: Mapping[str, str] | None = None
                 ) -> graph_pb2.GraphDef:
    """A GraphDef of ``graph``; ``placement`` (op -> device) overrides the ops' devices."""
    gd = graph_pb2.GraphDef()
    for op in graph:
        placed = placement is not None and op.name in placement
        if placed:
            op = op.with_(device=placement[op.name])
        if op.node_def is None:
            gd.node.extend(_synthesise(op))
            continue
        node = gd.node.add()
        node.ParseFromString(op.node_def)
        node.name, node.op, node.device = op.name, op.type, op.device
        del node.input[:]
        node.input.extend(_input_names(op))
        if "_fastt_origin" in op.attrs or placed:
            for key in _STALE_ATTRS:  # colocation comes from the IR (or the placement)
                if key in node.attr:
                    del node.attr[key]
            if op.colocate_with and not placed:
                node.attr["_class"].list.s.extend(f"loc:@{c}".encode() for c in
                                                  op.colocate_with)
    library = graph.payload.get("library")
    if library:
        gd.library.ParseFromString(library)
    return gd
