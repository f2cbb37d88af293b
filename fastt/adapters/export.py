"""IR graphs back to TensorFlow ``GraphDef``s, including the ops fastt's passes created.

Ops read from TensorFlow carry their NodeDef and are written back with the IR's name, inputs,
device and colocation. Ops fastt made have no NodeDef and are synthesised from their type and
attributes: ``SplitV`` (cut along ``axis`` into ``size_splits``), ``ConcatV2`` and ``AddN``
joins, ``Const``s (per-part shapes, folded shape queries), ``IdentityN``, ``Identity``,
``Reshape``, ``NoOp``, the element-wise ops, sums and ``Pack`` of a synchronised batch norm, and the
reads and assigns that keep a variable's copies equal to it. Sub-ops ``X/part{k}`` and
mirrored copies ``X/mirror{k}`` reuse X's NodeDef under their own name (a variable's copy with a
``shared_name`` of its own).
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2

from fastt.errors import FasttError
from fastt.ir import Graph, Op
from fastt.passes.data_parallel import BATCH_SHAPE
from fastt.passes.splitting import PART_SHAPE

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


def _node(name: str, type_: str, inputs: list[str], device: str,
          **types: str) -> node_def_pb2.NodeDef:
    node = node_def_pb2.NodeDef(name=name, op=type_, device=device)
    node.input.extend(inputs)
    for key, dtype in types.items():
        node.attr[key].type = _enum(dtype)
    return node


def _extent(name: str, shape: str, axis: int, dev: str) -> list[node_def_pb2.NodeDef]:
    """``name`` = entry ``axis`` of the int32 shape vector ``shape`` (a scalar)."""
    consts = [_const(f"{name}/{k}", v, "int32", dev)
              for k, v in (("begin", [axis]), ("end", [axis + 1]), ("strides", [1]))]
    node = _node(name, "StridedSlice", [shape] + [c.name for c in consts], dev,
                 T="int32", Index="int32")
    node.attr["shrink_axis_mask"].i = 1
    return consts + [node]


def _scaled(name: str, x: str, num: int, den: int, dev: str) -> list[node_def_pb2.NodeDef]:
    """``name`` = ``x * num // den`` (int32 scalars or vectors)."""
    out, last = [], x
    for k, (typ, v) in enumerate((("Mul", num), ("FloorDiv", den))):
        if v != 1:
            c = _const(f"{name}/{typ.lower()}_by", v, "int32", dev)
            out += [c, _node(f"{name}/{typ.lower()}", typ, [last, c.name], dev, T="int32")]
            last = out[-1].name
    out.append(_node(name, "Identity", [last], dev, T="int32"))
    return out


def _cast(name: str, x: str, dtype: str, dev: str, control: list[str]) -> node_def_pb2.NodeDef:
    """``name`` = the int32 ``x`` as ``dtype`` (waiting for ``control``)."""
    if dtype == "int32":
        return _node(name, "Identity", [x] + control, dev, T="int32")
    return _node(name, "Cast", [x] + control, dev, SrcT="int32", DstT=dtype)


def _dynamic(op: Op) -> list[node_def_pb2.NodeDef]:
    """NodeDefs of the shape ops fastt made, read at run time (see ``BATCH_SHAPE``,
    ``PART_SHAPE``): the step then runs at any batch size."""
    dev, a, name = op.device, op.attrs, op.name
    inputs = _input_names(op)
    control = [i for i in inputs if i.startswith("^")]
    if op.type == BATCH_SHAPE:
        nodes = _extent(f"{name}/batch", inputs[0], 0, dev)
        nodes += _scaled(f"{name}/extent", f"{name}/batch", a["multiple"], 1, dev)
    else:
        nodes = [_node(f"{name}/like", "Shape", [inputs[0]], dev, T=a["T"], out_type="int32")]
        nodes += _extent(f"{name}/like_extent", f"{name}/like", a["like_axis"], dev)
        nodes += _scaled(f"{name}/extent", f"{name}/like_extent", a["num"], a["den"], dev)
    if a.get("size"):
        others = math.prod(v for k, v in enumerate(a["value"]) if k != a["axis"])
        nodes += _scaled(f"{name}/int32", f"{name}/extent", others, 1, dev)
    else:  # the static vector with entry ``axis`` from the extent
        base = [0 if k == a["axis"] else v for k, v in enumerate(a["value"])]
        onehot = [int(k == a["axis"]) for k in range(len(a["value"]))]
        nodes += [_const(f"{name}/static", base, "int32", dev),
                  _const(f"{name}/onehot", onehot, "int32", dev),
                  _node(f"{name}/entry", "Mul", [f"{name}/onehot", f"{name}/extent"], dev,
                        T="int32"),
                  _node(f"{name}/int32", "AddV2", [f"{name}/static", f"{name}/entry"], dev,
                        T="int32")]
    return nodes + [_cast(name, f"{name}/int32", a["dtype"], dev, control)]


def _split_sizes(op: Op) -> list[node_def_pb2.NodeDef]:
    """``<SplitV>/size_splits`` computed from its input's extent at run time: part k of an
    extent ``m * b`` is ``m * (b * c[k+1] // t - b * c[k] // t)``, ``c`` the cumulated shares
    and ``t`` their total; at the planned extent, exactly the planned sizes."""
    dev, name, a = op.device, f"{op.name}/size_splits", op.attrs
    shares, sizes = a["shares"], a["size_splits"]
    total = sum(shares)
    m = sum(sizes) // total
    cum = [sum(shares[:k]) for k in range(len(shares) + 1)]
    nodes = [_node(f"{name}/shape", "Shape", [_input_names(op)[0]], dev,
                   T=op.outputs[0].dtype.removesuffix("_ref"), out_type="int32")]
    nodes += _extent(f"{name}/extent", f"{name}/shape", a["axis"], dev)
    nodes += _scaled(f"{name}/batch", f"{name}/extent", 1, m, dev)
    for side, c in (("hi", cum[1:]), ("lo", cum[:-1])):
        nodes.append(_const(f"{name}/{side}_shares", c, "int32", dev))
        nodes.append(_node(f"{name}/{side}_x", "Mul", [f"{name}/batch", f"{name}/{side}_shares"],
                           dev, T="int32"))
        nodes += _scaled(f"{name}/{side}", f"{name}/{side}_x", 1, total, dev)
    nodes.append(_node(f"{name}/diff", "Sub", [f"{name}/hi", f"{name}/lo"], dev, T="int32"))
    nodes += _scaled(name, f"{name}/diff", m, 1, dev)
    return nodes


def _synthesise(op: Op) -> list[node_def_pb2.NodeDef]:
    """NodeDefs for an op fastt created (with helper ops where TensorFlow needs them)."""
    dev = op.device
    if op.type == "Const":
        return [_const(op.name, op.attrs["value"], op.outputs[0].dtype, dev)]
    if op.type in (BATCH_SHAPE, PART_SHAPE):
        return _dynamic(op)
    node = node_def_pb2.NodeDef(name=op.name, op=op.type, device=dev)
    node.input.extend(_input_names(op))
    extra: list[node_def_pb2.NodeDef] = []
    if op.type == "SplitV":
        node.input.insert(1, f"{op.name}/size_splits")
        node.input.insert(2, f"{op.name}/fastt_axis")
        extra = [_const(f"{op.name}/fastt_axis", op.attrs["axis"], "int32", dev)]
        extra += _split_sizes(op) if "shares" in op.attrs else \
            [_const(f"{op.name}/size_splits", op.attrs["size_splits"], "int32", dev)]
        node.attr["num_split"].i = len(op.attrs["size_splits"])
        node.attr["T"].type = _enum(op.outputs[0].dtype)
        node.attr["Tlen"].type = _enum("int32")
    elif op.type == "ConcatV2":
        node.input.insert(len(op.inputs), f"{op.name}/fastt_axis")
        extra = [_const(f"{op.name}/fastt_axis", op.attrs["axis"], "int32", dev)]
        node.attr["N"].i = len(op.inputs)
        node.attr["T"].type = _enum(op.outputs[0].dtype)
        node.attr["Tidx"].type = _enum("int32")
    elif op.type in ("AddN", "Pack"):
        node.attr["N"].i = len(op.inputs)
        node.attr["T"].type = _enum(op.outputs[0].dtype)
        if op.type == "Pack":
            node.attr["axis"].i = int(op.attrs["axis"])
    elif op.type == "Reshape":
        node.input.insert(len(op.inputs), f"{op.name}/fastt_shape")
        extra = [_const(f"{op.name}/fastt_shape", op.attrs["shape"], "int32", dev)]
        node.attr["T"].type = _enum(op.outputs[0].dtype)
        node.attr["Tshape"].type = _enum("int32")
    elif op.type in ("Identity", "Sub", "Mul", "AddV2", "RealDiv", "Square", "Rsqrt"):
        node.attr["T"].type = _enum(op.outputs[0].dtype)
    elif op.type == "Sum":
        node.attr["T"].type = _enum(op.outputs[0].dtype)
        node.attr["Tidx"].type = _enum("int32")
        node.attr["keep_dims"].b = False
    elif op.type == "Size":
        node.attr["T"].type = _enum(op.attrs["T"])
        node.attr["out_type"].type = _enum(op.outputs[0].dtype)
    elif op.type == "NcclAllReduce":  # the all-reduce of GPUs in one process
        node.attr["T"].type = _enum(op.outputs[0].dtype)
        node.attr["reduction"].s = str(op.attrs["reduction"]).encode()
        node.attr["num_devices"].i = int(op.attrs["num_devices"])
        node.attr["shared_name"].s = str(op.attrs["shared_name"]).encode()
    elif op.type == "Cast":
        node.attr["SrcT"].type = _enum(op.attrs["SrcT"])
        node.attr["DstT"].type = _enum(op.attrs["DstT"])
        node.attr["Truncate"].b = False
    elif op.type == "NoOp":
        pass
    elif op.type in ("ReadVariableOp", "AssignVariableOp"):
        node.attr["dtype"].type = _enum(op.attrs["dtype"])
    elif op.type == "Assign":
        node.attr["T"].type = _enum(op.attrs["dtype"])
        node.attr["use_locking"].b = True
        node.attr["validate_shape"].b = True
    elif op.type == "IdentityN":
        node.attr["T"].list.type.extend(_enum(t.dtype) for t in op.outputs)
    elif op.type == "Fill":
        node.attr["T"].type = _enum(op.attrs["T"])
        node.attr["index_type"].type = _enum("int32")
    elif op.type == "Shape":
        node.attr["T"].type = _enum(op.attrs["T"])
        node.attr["out_type"].type = _enum(op.attrs["out_type"])
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
        if placement is not None and placed:
            op = op.with_(device=placement[op.name])
        if op.node_def is None:
            gd.node.extend(_synthesise(op))
            if op.colocate_with and not placed:
                gd.node[-1].attr["_class"].list.s.extend(f"loc:@{c}".encode()
                                                         for c in op.colocate_with)
            continue
        node = gd.node.add()
        node.ParseFromString(op.node_def)
        node.name, node.op, node.device = op.name, op.type, op.device
        del node.input[:]
        node.input.extend(_input_names(op))
        if op.meta.origin is not None or placed:
            for key in _STALE_ATTRS:  # colocation comes from the IR (or the placement)
                if key in node.attr:
                    del node.attr[key]
            if op.colocate_with and not placed:
                node.attr["_class"].list.s.extend(f"loc:@{c}".encode() for c in
                                                  op.colocate_with)
            if op.is_variable and op.meta.origin is not None:  # a variable's copy: a
                node.attr["shared_name"].s = op.name.encode()  # resource of its own
    library = graph.meta.library
    if library:
        gd.library.ParseFromString(library)
    return gd
