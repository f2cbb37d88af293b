"""Seeded random streams that continue across sessions, value for value.

A seeded stateful random op (``RandomUniform``, ``RandomStandardNormal``, ``TruncatedNormal``,
``RandomUniformInt``: dropout masks, synthetic data, initializers) keeps its position in a
Philox stream inside its kernel, which a new session creates anew: left as it is, the stream
would start again at each activation and rollback. TensorFlow's kernel draws call k of an op
with seeds (s, s2) from Philox with key ``s`` and the 128-bit counter ``(256 * N, s2)``, where
N counts the elements the op drew before (256 samples are reserved per element), so the
stateless V2 op of the same distribution, given that key and counter, returns the same
values bit for bit. In fastt's graphs each such op becomes that stateless op reading its N
from a counter variable that advances by 256 elements per run and travels with the rest of
the state; in the user's own session, where the graph cannot change, fastt counts what each
run draws. Ops with no seed (fresh entropy in every session) and ops inside ``tf.cond``,
``tf.while_loop`` or functions (how often they run is not known from outside) are left as
they are.
"""
from __future__ import annotations

import threading
from typing import AbstractSet, Any, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2, types_pb2

from fastt.plugin.state import RunFanIn, Value
from tf_patches.control_flow import in_control_flow

STATELESS = {"RandomUniform": "StatelessRandomUniformV2",
             "RandomStandardNormal": "StatelessRandomNormalV2",
             "TruncatedNormal": "StatelessTruncatedNormalV2",
             "RandomUniformInt": "StatelessRandomUniformIntV2"}
SAMPLES_PER_ELEMENT = 256  # what TensorFlow's stateful kernels reserve per output element
PHILOX = 1  # the ``alg`` of the stateless V2 ops
COUNTER = "fastt_stream"  # a counter variable is named COUNTER + "/" + the op's name


def counter_name(op: str) -> str:
    return f"{COUNTER}/{op}"


def _seeded(op: Any) -> bool:
    return op.type in STATELESS and bool(op.get_attr("seed") or op.get_attr("seed2"))


def _top_level(op: tf.Operation) -> bool:
    return not in_control_flow(op)


class StreamCounter:
    """How far each seeded random op of the user's graph has drawn in the user's session:
    each run's random ops are found once per signature; the draws of ops whose shape is
    known count directly, the others' shapes are fetched with the run (``extra``)."""

    def __init__(self, graph: tf.Graph, fan_in: RunFanIn | None = None) -> None:
        self.graph, self.fan_in = graph, fan_in or RunFanIn(graph)
        self.drawn: dict[str, int] = {}
        self._version = -1
        self._ops: dict[str, tf.Operation] = {}
        self._runs: dict[Any, tuple[list[tuple[str, int]], list[tf.Operation]]] = {}
        self._lock = threading.Lock()  # queue runners' threads run too

    def _refresh(self) -> None:
        if self._version != self.graph.version:
            self._version = self.graph.version
            self._ops = {op.name: op for op in self.graph.get_operations()
                         if _seeded(op) and _top_level(op)}
            self._runs = {}

    def extra(self, fetches: list[str], targets: list[str], feeds: list[str]
              ) -> tuple[Any, list[tf.Tensor]]:
        """(a key for ``count``, the tensors to fetch with a run of these names so that
        ``count`` knows what it drew: the shape inputs of its random ops whose shape is not
        static)."""
        self._refresh()
        key = (tuple(fetches), tuple(targets), tuple(sorted(feeds)))
        if key not in self._runs:
            ran = self.fan_in(fetches, targets, feeds) & set(self._ops)
            static, dynamic = [], []
            for name in ran:
                shape = self._ops[name].outputs[0].shape
                if shape.is_fully_defined():
                    static.append((name, shape.num_elements()))
                else:
                    dynamic.append(self._ops[name])
            self._runs[key] = (static, dynamic)
        return key, [op.inputs[0] for op in self._runs[key][1]]

    def count(self, key: Any, shapes: list[Any]) -> None:
        """Record a run that succeeded (``key`` from ``extra``, ``shapes`` the values of the
        tensors it said to fetch)."""
        static, dynamic = self._runs[key]
        drawn = static + [(op.name, int(np.prod(s))) for op, s in zip(dynamic, shapes)]
        with self._lock:
            for name, n in drawn:
                self.drawn[name] = self.drawn.get(name, 0) + n

    def values(self) -> dict[str, Value]:
        """Counter variable -> its value, as fastt's graphs hold it."""
        return {counter_name(n): np.int64(SAMPLES_PER_ELEMENT * k) for n, k in self.drawn.items()}


def continue_streams(gd: graph_pb2.GraphDef, graph: tf.Graph,
                     elsewhere: AbstractSet[str] = frozenset()
                     ) -> tuple[graph_pb2.GraphDef, list[str], list[str]]:
    """``gd`` with every seeded top-level random op of ``graph`` (the user's) drawing from a
    counter variable; the names of those variables; the seeded random ops left as they are
    (but those of the functions ``elsewhere``, which run in the user's session only: the
    datasets of the iterators kept there). The op's name now belongs to an Identity that
    waits for the counter to advance, so that any run reading its values advances the stream
    once."""
    seeded = [op for op in graph.get_operations() if _seeded(op)]
    ops = {op.name for op in seeded if _top_level(op)}
    left = [op.name for op in seeded if op.name not in ops]
    left += [f"{f.signature.name}/{n.name}" for f in gd.library.function for n in f.node_def
             if f.signature.name not in elsewhere
             and n.op in STATELESS and (n.attr["seed"].i or n.attr["seed2"].i)]
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(gd.versions)
    out.library.CopyFrom(gd.library)
    counters = []
    for node in gd.node:
        if node.name in ops and node.op in STATELESS:
            out.node.extend(_stateless(node))
            counters.append(counter_name(node.name))
        else:
            out.node.add().CopyFrom(node)
    return out, counters, left


def _node(name: str, op: str, device: str, inputs: Sequence[str] = (), **attrs: Any
          ) -> node_def_pb2.NodeDef:
    n = node_def_pb2.NodeDef(name=name, op=op, device=device)
    n.input.extend(inputs)
    for k, v in attrs.items():
        n.attr[k].CopyFrom(v)
    return n


def _type(t: int) -> attr_value_pb2.AttrValue:
    return attr_value_pb2.AttrValue(type=t)


def _const(name: str, device: str, value: Any, dtype: tf.DType) -> node_def_pb2.NodeDef:
    proto = tf.make_tensor_proto(value, dtype=dtype)
    return _node(name, "Const", device, value=attr_value_pb2.AttrValue(tensor=proto),
                 dtype=_type(dtype.as_datatype_enum))


def _stateless(node: node_def_pb2.NodeDef) -> list[node_def_pb2.NodeDef]:
    """The ops replacing the stateful random ``node`` (see ``continue_streams``)."""
    name, dev = node.name, node.device
    seed, seed2 = node.attr["seed"].i, node.attr["seed2"].i
    var = counter_name(name)
    i64 = _type(types_pb2.DT_INT64)
    shape_type = node.attr["T"]
    out_type = node.attr["Tout"] if node.op == "RandomUniformInt" else node.attr["dtype"]
    data = [i for i in node.input if not i.startswith("^")]
    control = [i for i in node.input if i.startswith("^")]
    draw = _node(f"{name}/fastt_draw", STATELESS[node.op], dev,
                 [data[0], f"{name}/fastt_key", f"{name}/fastt_counter", f"{name}/fastt_alg"]
                 + data[1:] + control, dtype=out_type, Tshape=shape_type)
    for k, v in node.attr.items():
        if k.startswith("_"):  # placement hints, priorities
            draw.attr[k].CopyFrom(v)
    return [
        _node(var, "VarHandleOp", dev, dtype=i64,
              shape=attr_value_pb2.AttrValue(shape=tf.TensorShape([]).as_proto()),
              shared_name=attr_value_pb2.AttrValue(s=var.encode()),
              container=attr_value_pb2.AttrValue(s=b"")),
        _node(f"{name}/fastt_drawn", "ReadVariableOp", dev, [var], dtype=i64),
        _const(f"{name}/fastt_seed2", dev, seed2, tf.int64),
        _node(f"{name}/fastt_counter_i64", "Pack", dev,
              [f"{name}/fastt_drawn", f"{name}/fastt_seed2"], N=attr_value_pb2.AttrValue(i=2),
              T=i64, axis=attr_value_pb2.AttrValue(i=0)),
        _node(f"{name}/fastt_counter", "Bitcast", dev, [f"{name}/fastt_counter_i64"], T=i64,
              type=_type(types_pb2.DT_UINT64)),
        _const(f"{name}/fastt_key", dev, [seed % (1 << 64)], tf.uint64),
        _const(f"{name}/fastt_alg", dev, PHILOX, tf.int32),
        draw,
        _node(f"{name}/fastt_shape", "Cast", dev, [data[0]], SrcT=shape_type, DstT=i64,
              Truncate=attr_value_pb2.AttrValue(b=False)),
        _const(f"{name}/fastt_axis", dev, [0], tf.int32),
        _node(f"{name}/fastt_elements", "Prod", dev,
              [f"{name}/fastt_shape", f"{name}/fastt_axis"], T=i64,
              Tidx=_type(types_pb2.DT_INT32), keep_dims=attr_value_pb2.AttrValue(b=False)),
        _const(f"{name}/fastt_per_element", dev, SAMPLES_PER_ELEMENT, tf.int64),
        _node(f"{name}/fastt_samples", "Mul", dev,
              [f"{name}/fastt_elements", f"{name}/fastt_per_element"], T=i64),
        _node(f"{name}/fastt_advance", "AssignAddVariableOp", dev,
              [var, f"{name}/fastt_samples", f"^{name}/fastt_draw"], dtype=i64),
        _node(name, "Identity", dev, [f"{name}/fastt_draw", f"^{name}/fastt_advance"],
              T=out_type),
    ]


def skipped_note(skipped: list[str]) -> str:
    """What the log says of the seeded random ops left as they are (none: '')."""
    if not skipped:
        return ""
    return (f"{len(skipped)} seeded random ops inside tf.cond, tf.while_loop or functions "
            f"(e.g. {skipped[0]!r}) start their streams anew in fastt's graphs")
