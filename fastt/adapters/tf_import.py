"""TensorFlow graphs in and out of the IR: ``tf.Graph``, ``GraphDef``, ``MetaGraphDef`` files.

Everything here goes through TensorFlow's public graph API and protobufs; the IR it returns
knows nothing of TensorFlow. The NodeDef of every op travels in ``Op.node_def`` so that
``fastt.adapters.export.to_graph_def`` gives TensorFlow back the same ops, edges and attributes.
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Mapping

import tensorflow as tf
from google.protobuf import message, text_format
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from fastt import dtypes
from fastt.errors import GraphFormatError, UnknownDtypeError
from fastt.ir import Graph, GraphMeta, Op, TensorRef, TensorSpec
from fastt.op_types import VARIABLE_TYPES

_SKIPPED_ATTRS = frozenset({"value", "_class"})  # constants' payload; colocation kept apart


def _attr_value(v: attr_value_pb2.AttrValue, where: str) -> Any:
    kind = v.WhichOneof("value")
    if kind == "s":
        return v.s.decode("utf-8", errors="replace")
    if kind in ("i", "f", "b"):
        return getattr(v, kind)
    if kind == "type":
        return dtypes.name_from_enum(v.type, where)
    if kind == "shape":
        return None if v.shape.unknown_rank else [int(d.size) for d in v.shape.dim]
    if kind == "func":
        return v.func.name
    if kind == "list":
        lst = v.list
        if lst.type:
            return [dtypes.name_from_enum(t, where) for t in lst.type]
        for field in ("i", "f", "b"):
            if getattr(lst, field):
                return list(getattr(lst, field))
        if lst.s:
            return [s.decode("utf-8", errors="replace") for s in lst.s]
        if lst.shape:
            return [None if s.unknown_rank else [int(d.size) for d in s.dim] for s in lst.shape]
        return []
    return None  # tensors, placeholders: not needed by any pass


def _small_int_const(node: node_def_pb2.NodeDef) -> Any:
    """The value of an integer Const of at most 16 elements (axes, perms, shapes), else None."""
    t = node.attr["value"].tensor
    if t.dtype not in (3, 9) or sum(1 for _ in t.tensor_shape.dim) > 1:  # int32, int64
        return None
    dims = [d.size for d in t.tensor_shape.dim]
    if dims and dims[0] > 16:
        return None
    value = tf.make_ndarray(t)
    return value.tolist()


def _attrs(node: node_def_pb2.NodeDef) -> dict[str, Any]:
    out = {}
    if node.op == "Const" and "value" in node.attr:
        value = _small_int_const(node)
        if value is not None:
            out["value"] = value
    for key, value in node.attr.items():
        if key in _SKIPPED_ATTRS:
            continue
        v = _attr_value(value, f"op {node.name!r} attr {key!r}")
        if v is not None:
            out[key] = v
    return out


def _colocate_with(node: node_def_pb2.NodeDef) -> tuple[str, ...]:
    groups = [s.decode() for s in node.attr["_class"].list.s] if "_class" in node.attr else []
    names = [g[len("loc:@"):] for g in groups if g.startswith("loc:@")]
    return tuple(n for n in names if n != node.name)


def _check_dtypes(graph_def: graph_pb2.GraphDef) -> None:
    """Reject unknown dtype enums with a message naming the op, before TensorFlow sees them."""
    for node in graph_def.node:
        for key, value in node.attr.items():
            where = f"op {node.name!r} ({node.op}) attr {key!r}"
            if value.WhichOneof("value") == "type":
                dtypes.name_from_enum(value.type, where)
            elif value.WhichOneof("value") == "list":
                for t in value.list.type:
                    dtypes.name_from_enum(t, where)


def from_tf_graph(graph: tf.Graph, name: str = "") -> Graph:
    """The IR of a ``tf.Graph`` (every op, data and control edge, static shapes)."""
    ops = []
    stateful_types: dict[str, bool] = {}  # an op's OpDef is its type's
    for tf_op in graph.get_operations():
        node = tf_op.node_def
        outputs = []
        for i, t in enumerate(tf_op.outputs):
            dtype = t.dtype.name
            if not dtypes.is_known(dtype):
                raise UnknownDtypeError(f"op {tf_op.name!r} output {i} has unknown dtype {dtype!r}")
            shape = None if t.shape.rank is None else tuple(t.shape.as_list())
            outputs.append(TensorSpec(dtype, shape))
        stateful = stateful_types.get(tf_op.type)
        if stateful is None:
            try:
                op_def = tf_op.op_def
                # An op writing through a reference input (Assign, ApplyAdam, ScatterAdd on
                # a reference variable) is not marked stateful in its OpDef, but it is.
                stateful = bool(op_def.is_stateful) or any(a.is_ref for a in op_def.input_arg)
            except (ValueError, AttributeError):
                stateful = True
            stateful_types[tf_op.type] = stateful
        ops.append(Op(
            name=tf_op.name, type=tf_op.type,
            inputs=tuple(TensorRef(t.op.name, t.value_index) for t in tf_op.inputs),
            control_inputs=tuple(i[1:] for i in node.input if i.startswith("^")),
            outputs=tuple(outputs), device=tf_op.device, colocate_with=_colocate_with(node),
            stateful=stateful, is_variable=tf_op.type in VARIABLE_TYPES,
            attrs=_attrs(node), node_def=node.SerializeToString()))
    library = graph.as_graph_def().library
    return Graph(ops, name=name, meta=GraphMeta(
        library=library.SerializeToString() if library.function else None))


def from_graph_def(graph_def: graph_pb2.GraphDef, name: str = "") -> Graph:
    """The IR of a ``GraphDef`` (imported into a fresh ``tf.Graph`` for shapes and dtypes)."""
    _check_dtypes(graph_def)
    g = tf.Graph()
    try:
        with g.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
    except (ValueError, TypeError, tf.errors.OpError) as e:
        raise GraphFormatError(f"TensorFlow cannot import graph {name or '<GraphDef>'!r}: "
                               f"{str(e).splitlines()[0]}") from None
    return from_tf_graph(g, name=name)


def read_graph_def(path: str | os.PathLike[str]) -> tuple[graph_pb2.GraphDef, dict[str, Any]]:
    """Read a GraphDef or MetaGraphDef file (binary or text); return the GraphDef and
    what else a MetaGraphDef says (its collections' node names, by collection)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise GraphFormatError(f"graph file {path!r} does not exist")
    if os.path.isdir(path):
        raise GraphFormatError(f"graph file {path!r} is a directory, not a GraphDef or "
                               "MetaGraphDef file")
    with open(path, "rb") as f:
        data = f.read()
    for parse in (_parse_meta_binary, _parse_graph_binary, _parse_meta_text, _parse_graph_text):
        found = parse(data)
        if found is not None:
            return found
    raise GraphFormatError(f"{path!r} is not a TensorFlow GraphDef or MetaGraphDef "
                           "(binary or text protobuf with at least one node)")


def _plausible(gd: graph_pb2.GraphDef) -> bool:
    return len(gd.node) > 0 and all(n.name and n.op for n in gd.node)


def _collections(meta: meta_graph_pb2.MetaGraphDef) -> dict[str, list[str]]:
    out = {}
    for key, col in meta.collection_def.items():
        if col.HasField("node_list"):
            out[key] = list(col.node_list.value)
    return out


def _parse_binary(data: bytes, proto: Any) -> Any:
    """``data`` parsed into a new ``proto`` message, or None when it is not one."""
    msg = proto()
    try:
        msg.ParseFromString(data)
    except message.DecodeError:
        return None
    return msg


def _parse_meta_binary(data: bytes) -> tuple[graph_pb2.GraphDef, dict[str, Any]] | None:
    meta = _parse_binary(data, meta_graph_pb2.MetaGraphDef)
    return (meta.graph_def, {"collections": _collections(meta)}) \
        if meta is not None and _plausible(meta.graph_def) else None


def _parse_graph_binary(data: bytes) -> tuple[graph_pb2.GraphDef, dict[str, Any]] | None:
    gd = _parse_binary(data, graph_pb2.GraphDef)
    return (gd, {}) if gd is not None and _plausible(gd) else None


def _parse_text(data: bytes, proto: Any) -> Any:
    try:
        return text_format.Parse(data.decode("utf-8"), proto)
    except (text_format.ParseError, UnicodeDecodeError):
        return None


def _parse_meta_text(data: bytes) -> tuple[graph_pb2.GraphDef, dict[str, Any]] | None:
    meta = _parse_text(data, meta_graph_pb2.MetaGraphDef())
    return (meta.graph_def, {"collections": _collections(meta)}) \
        if meta is not None and _plausible(meta.graph_def) else None


def _parse_graph_text(data: bytes) -> tuple[graph_pb2.GraphDef, dict[str, Any]] | None:
    gd = _parse_text(data, graph_pb2.GraphDef())
    return (gd, {}) if gd is not None and _plausible(gd) else None


def load_graph(path: str | os.PathLike[str]) -> Graph:
    """The IR of a GraphDef or MetaGraphDef file; a MetaGraphDef's collections go in
    ``graph.meta.collections`` (e.g. ``train_op``)."""
    graph_def, extra = read_graph_def(path)
    g = from_graph_def(graph_def, name=os.path.basename(os.fspath(path)))
    g.meta = replace(g.meta, **extra)
    return g


def with_feed_shapes(graph_def: graph_pb2.GraphDef,
                     feed_shapes: Mapping[str, tuple[int, ...]], name: str = "") -> Graph:
    """The IR with placeholders given the shapes of a sample feed, so that TensorFlow's shape
    inference resolves the shapes a static graph leaves unknown (e.g. the batch size)."""
    return from_graph_def(_pinned(graph_def, feed_shapes, strict=True), name=name)


def inferred_shapes(graph_def: graph_pb2.GraphDef,
                    source_shapes: Mapping[str, tuple[int, ...]]) -> dict[TensorRef, tuple]:
    """Every fully known output shape once the graph's inputs (placeholders, iterator
    outputs: ``"op:index" -> shape``, as measured) have the given shapes: TensorFlow's own
    shape inference. Ops a run never reports (grappler fuses them away) get their shapes
    here. Empty when TensorFlow rejects the pinned shapes."""
    try:
        g = from_graph_def(_pinned(graph_def, source_shapes, strict=False))
    except GraphFormatError:
        return {}
    return {TensorRef(op.name, i): t.dims for op in g for i, t in enumerate(op.outputs)
            if t.dims is not None}


def _pinned(graph_def: graph_pb2.GraphDef, shapes: Mapping[str, tuple[int, ...]],
            strict: bool) -> graph_pb2.GraphDef:
    """A copy of ``graph_def`` with the shapes of its placeholders and iterator outputs set."""
    gd = graph_pb2.GraphDef()
    gd.CopyFrom(graph_def)
    by_name = {n.name: n for n in gd.node}
    for tensor, shape in shapes.items():
        op, _, index = tensor.partition(":")
        node = by_name.get(op)
        if node is None:
            if strict:
                raise GraphFormatError(f"sample feed names {tensor!r}, which is not an op of "
                                       "the graph")
            continue
        proto = tf.TensorShape(list(shape)).as_proto()
        if node.op in ("Placeholder", "PlaceholderWithDefault"):
            node.attr["shape"].shape.CopyFrom(proto)
        elif node.op == "IteratorGetNext":
            listed = node.attr["output_shapes"].list.shape
            k = int(index or 0)
            if k < len(listed) and len(listed[k].dim) in (0, len(shape)):
                listed[k].CopyFrom(proto)
    return gd
