"""Rough analytical work of an op (floating-point operations), from its static shapes.

Used where measured time must be shared out: between the ops grappler fused into one kernel, and
between the sub-ops of a split op before they are profiled. Only the ratios matter.
"""
from __future__ import annotations

import math

from fastt.ir import Graph, Op
from fastt.op_types import CONV_TYPES, MATMUL_TYPES


def _elements(shape: tuple[int | None, ...] | None) -> int | None:
    known = [d for d in shape or () if d is not None and d >= 0]
    return math.prod(known) if shape is not None and len(known) == len(shape) else None


def _input_shape(graph: Graph, op: Op, i: int) -> tuple[int | None, ...] | None:
    return graph.tensor(op.inputs[i]).shape if i < len(op.inputs) else None


def flops(op: Op, graph: Graph) -> float:
    """Estimated floating-point operations of ``op`` (>= 1; 1 when nothing is known)."""
    out = _elements(op.outputs[0].shape) if op.outputs else None
    if op.type in CONV_TYPES:
        # Forward conv and both backprops do the same multiply-adds: 2 * N*H*W*Cout * kh*kw*Cin.
        big = max((_elements(_input_shape(graph, op, i)) or 0 for i in range(len(op.inputs))),
                  default=0)
        flt = _filter_shape(graph, op)
        if flt is not None and len(flt) >= 4 and None not in flt:
            kh, kw, cin = flt[-4], flt[-3], flt[-2]
            act = _activation_elements(graph, op)
            if act and kh is not None and kw is not None and cin is not None:
                return float(2 * act * kh * kw * cin)
        return float(max(big, out or 0, 1))
    if op.type in MATMUL_TYPES and len(op.inputs) >= 2:
        a = _input_shape(graph, op, 0)
        if a is not None and out is not None and len(a) >= 2 and a[-1] is not None:
            k = a[-2] if op.attrs.get("transpose_a") or op.attrs.get("adj_x") else a[-1]
            if k is not None:
                return float(2 * out * k)
    return float(max(out or 1, 1))


def _filter_shape(graph: Graph, op: Op) -> tuple[int | None, ...] | None:
    if op.type.endswith("BackpropFilter"):
        # The filter shape is the op's output.
        return op.outputs[0].shape if op.outputs else None
    return _input_shape(graph, op, 1)


def _activation_elements(graph: Graph, op: Op) -> int | None:
    """Elements of the conv's output activation (N*H*W*Cout), whichever tensor holds it."""
    if op.type.endswith(("BackpropInput", "BackpropFilter")):
        return _elements(_input_shape(graph, op, 2))  # the output gradient
    return _elements(op.outputs[0].shape) if op.outputs else None
