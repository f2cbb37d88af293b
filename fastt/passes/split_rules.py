"""How each op type can be split into sub-ops without changing what it computes.

A ``SplitRule`` says, for one named dimension of an op, what each input becomes (cut along an
axis, passed whole, or a shape vector whose entry shrinks) and how the sub-ops' outputs are
joined (concatenated along an axis, or summed where the op reduces over the split dimension:
a weight gradient split on the batch). BatchNorm statistics are never split on the batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from fastt.ir import Graph, Op, TensorRef
from fastt.op_types import BINARY, POOL, REDUCE, UNARY

SPLIT, FULL, SHAPE, PARTIAL = "split", "full", "shape", "partial"


@dataclass(frozen=True)
class Part:
    kind: str  # SPLIT: cut along ``axis``; FULL: whole tensor; SHAPE: entry ``axis`` shrinks;
    # PARTIAL: part k of a producer split with a sum join (its k-th partial sum)
    axis: int = 0


@dataclass(frozen=True)
class SplitRule:
    dim: str  # "batch", "channel", "rows", "cols", "reduce"
    inputs: tuple[Part, ...]
    join: str  # "concat" or "sum"
    out_axis: int  # output axis divided among the sub-ops ("concat"); -1 for "sum"

    def base(self, op: Op, graph: Graph) -> int | None:
        """The common divisor of every extent this rule cuts (inputs and output): what the
        parts are shares of. A reshape [B, T, D] -> [B*T, D] cuts B and B*T: its base is B."""
        sizes = []
        for part, ref in zip(self.inputs, op.inputs):
            if part.kind == SPLIT:
                shape = graph.tensor(ref).shape
                sizes.append(shape[part.axis] if shape and part.axis < len(shape) else None)
        if self.join == "concat" or any(p.kind == SHAPE for p in self.inputs):
            axis = self.out_axis if self.join == "concat" else \
                next(p.axis for p in self.inputs if p.kind == SHAPE)
            shape = op.outputs[0].shape
            sizes.append(shape[axis] if shape and axis < len(shape) else None)
        known = [s for s in sizes if s is not None and s > 0]
        if not sizes or len(known) < len(sizes):
            return None
        return math.gcd(*known)


def _channel_axis(op: Op, rank: int = 4) -> int:
    return 1 if str(op.attrs.get("data_format", "NHWC")).startswith("NC") else rank - 1


def _rank(graph: Graph, op: Op, i: int) -> int | None:
    shape = graph.tensor(op.inputs[i]).shape if i < len(op.inputs) else None
    return None if shape is None else len(shape)


#: ops of several outputs that work row by row (``_several``): each output is cut like the rows
SEVERAL = frozenset({"Split", "SplitV", "Unpack", "SparseSoftmaxCrossEntropyWithLogits",
                     "SoftmaxCrossEntropyWithLogits"})


Rules = Callable[[Op, Graph], "list[SplitRule]"]


def _conv2d(op: Op, graph: Graph) -> list[SplitRule]:
    c = _channel_axis(op)
    return [SplitRule("batch", (Part(SPLIT, 0), Part(FULL)), "concat", 0),
            SplitRule("channel", (Part(FULL), Part(SPLIT, 3)), "concat", c)]


def _conv2d_backprop_input(op: Op, graph: Graph) -> list[SplitRule]:
    c = _channel_axis(op)  # inputs: (input_sizes, filter, out_backprop)
    return [SplitRule("batch", (Part(SHAPE, 0), Part(FULL), Part(SPLIT, 0)), "concat", 0),
            SplitRule("channel", (Part(SHAPE, c), Part(SPLIT, 2), Part(FULL)), "concat", c)]


def _conv2d_backprop_filter(op: Op, graph: Graph) -> list[SplitRule]:
    c = _channel_axis(op)  # inputs: (input, filter_sizes, out_backprop)
    return [SplitRule("batch", (Part(SPLIT, 0), Part(FULL), Part(SPLIT, 0)), "sum", -1),
            SplitRule("channel", (Part(FULL), Part(SHAPE, 3), Part(SPLIT, c)), "concat", 3)]


def _matmul(op: Op, graph: Graph) -> list[SplitRule]:
    ta, tb = bool(op.attrs.get("transpose_a")), bool(op.attrs.get("transpose_b"))
    return [SplitRule("rows", (Part(SPLIT, 1 if ta else 0), Part(FULL)), "concat", 0),
            SplitRule("cols", (Part(FULL), Part(SPLIT, 0 if tb else 1)), "concat", 1),
            SplitRule("reduce", (Part(SPLIT, 0 if ta else 1), Part(SPLIT, 1 if tb else 0)),
                      "sum", -1)]


def _batch_matmul(op: Op, graph: Graph) -> list[SplitRule]:
    r = _rank(graph, op, 0)
    if r is None or r < 3 or _rank(graph, op, 1) != r:
        return []
    ax, ay = bool(op.attrs.get("adj_x")), bool(op.attrs.get("adj_y"))
    return [SplitRule("batch", (Part(SPLIT, 0), Part(SPLIT, 0)), "concat", 0),
            SplitRule("rows", (Part(SPLIT, r - 1 if ax else r - 2), Part(FULL)), "concat",
                      r - 2),
            SplitRule("cols", (Part(FULL), Part(SPLIT, r - 2 if ay else r - 1)), "concat",
                      r - 1)]


def _pool(op: Op, graph: Graph) -> list[SplitRule]:
    c = _channel_axis(op)
    return [SplitRule("batch", (Part(SPLIT, 0),), "concat", 0),
            SplitRule("channel", (Part(SPLIT, c),), "concat", c)]


def _max_pool_grad(op: Op, graph: Graph) -> list[SplitRule]:
    c = _channel_axis(op)  # inputs: (orig_input, orig_output, grad)
    return [SplitRule(d, (Part(SPLIT, a),) * 3, "concat", a) for d, a in
            (("batch", 0), ("channel", c))]


def _avg_pool_grad(op: Op, graph: Graph) -> list[SplitRule]:
    c = _channel_axis(op)  # inputs: (orig_input_shape, grad)
    return [SplitRule(d, (Part(SHAPE, a), Part(SPLIT, a)), "concat", a) for d, a in
            (("batch", 0), ("channel", c))]


def _bias_add_grad(op: Op, graph: Graph) -> list[SplitRule]:
    return [SplitRule("batch", (Part(SPLIT, 0),), "sum", -1)]


def _reshape(op: Op, graph: Graph) -> list[SplitRule]:
    """Rows stay rows: [B, ...] -> [B*k, ...] or [B*k, ...] -> [B, ...]."""
    if len(op.inputs) != 2:
        return []
    src, out = graph.tensor(op.inputs[0]).shape, op.outputs[0].shape
    rows_in = src[0] if src and None not in src else None
    rows_out = out[0] if out and None not in out else None
    # With equal element counts, divisible leading dims keep whole rows together.
    if rows_in is not None and rows_out is not None and rows_in > 1 and rows_out > 1 \
            and (rows_out % rows_in == 0 or rows_in % rows_out == 0):
        return [SplitRule("batch", (Part(SPLIT, 0), Part(SHAPE, 0)), "concat", 0)]
    return []


def _concat_rows(op: Op, graph: Graph) -> list[SplitRule]:
    return _concat(op, graph) if len(op.inputs) >= 2 else []  # along another axis


def _slice(op: Op, graph: Graph) -> list[SplitRule]:
    """(A concat's gradient) every row kept: begin is 0 there, size follows each part."""
    if len(op.inputs) == 3 and _keeps_rows(graph, op):
        return [SplitRule("batch", (Part(SPLIT, 0), Part(FULL), Part(SHAPE, 0)), "concat", 0)]
    return []


def _pad(op: Op, graph: Graph) -> list[SplitRule]:
    """(A strided conv's explicit padding) no row added: the rows are padded one by one."""
    if len(op.inputs) >= 2 and _keeps_rows(graph, op):
        return [SplitRule("batch", (Part(SPLIT, 0),) + (Part(FULL),) * (len(op.inputs) - 1),
                          "concat", 0)]
    return []


def _tile(op: Op, graph: Graph) -> list[SplitRule]:
    """(A mean's gradient) the multiple is 1 on the rows."""
    if len(op.inputs) == 2 and _keeps_rows(graph, op):
        return [SplitRule("batch", (Part(SPLIT, 0), Part(FULL)), "concat", 0)]
    return []


def _pack(op: Op, graph: Graph) -> list[SplitRule]:
    """(An RNN's outputs stacked on the time axis) row k of each input makes row k."""
    out = op.outputs[0].shape
    if out and _rows_kept(graph, op.inputs, out) and int(op.attrs.get("axis", 0)) % len(out):
        return [SplitRule("batch", (Part(SPLIT, 0),) * len(op.inputs), "concat", 0)]
    return []


def _gather(op: Op, graph: Graph) -> list[SplitRule]:
    """Rows of an embedding lookup; or, where the gather is batched (``batch_dims`` >= 1:
    each example picks from its own rows), the examples of both inputs."""
    if len(op.inputs) != 3:
        return []
    batch_dims, axis = op.attrs.get("batch_dims") or 0, _const(graph, op, 2)
    if axis == 0 and not batch_dims:
        return [SplitRule("batch", (Part(FULL), Part(SPLIT, 0), Part(FULL)), "concat", 0)]
    if batch_dims >= 1 and isinstance(axis, int) and axis >= batch_dims:
        return [SplitRule("batch", (Part(SPLIT, 0), Part(SPLIT, 0), Part(FULL)), "concat", 0)]
    return []


#: op type -> its split rules (ops of one output of known shape; ``SEVERAL``: ``_several``).
#: A new rule is one entry here and its function (docs/extending.md).
RULES: dict[str, Rules] = {
    "Conv2D": _conv2d, "Conv2DBackpropInput": _conv2d_backprop_input,
    "Conv2DBackpropFilter": _conv2d_backprop_filter, "MatMul": _matmul,
    **dict.fromkeys(("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"), _batch_matmul),
    **dict.fromkeys(POOL, _pool), "MaxPoolGrad": _max_pool_grad,
    "AvgPoolGrad": _avg_pool_grad, "BiasAddGrad": _bias_add_grad, "Reshape": _reshape,
    **dict.fromkeys(UNARY | BINARY, lambda op, graph: _elementwise(op, graph)),
    **dict.fromkeys(REDUCE | {"Transpose", "ExpandDims", "Squeeze"},
                    lambda op, graph: _batch_local(op, graph)),
    "ConcatV2": _concat_rows, "Slice": _slice,
    **dict.fromkeys(("Pad", "PadV2", "MirrorPad"), _pad), "Tile": _tile, "Pack": _pack,
    "GatherV2": _gather,
}


def rules(op: Op, graph: Graph) -> list[SplitRule]:
    """The split rules of ``op`` (empty when it cannot be split)."""
    if any(graph.tensor(r).dtype in ("resource",) or graph.tensor(r).dtype.endswith("_ref")
           for r in op.inputs):
        return []
    if op.type in SEVERAL:
        return _several(op, graph)
    if len(op.outputs) != 1 or op.outputs[0].shape is None:
        return []
    rule = RULES.get(op.type)
    return rule(op, graph) if rule is not None else []


def _const(graph: Graph, op: Op, i: int) -> Any:
    src = graph[op.inputs[i].op] if i < len(op.inputs) else None
    return src.attrs.get("value") if src is not None and src.type == "Const" else None


def _rows_kept(graph: Graph, inputs: tuple[TensorRef, ...],
               out: tuple[int | None, ...] | None) -> bool:
    """Whether ``inputs`` all have ``out``'s leading extent (more than one row)."""
    if not out or out[0] is None or out[0] < 2:
        return False
    shapes = [graph.tensor(r).shape for r in inputs]
    return all(sh and sh[0] == out[0] for sh in shapes)


def _several(op: Op, graph: Graph) -> list[SplitRule]:
    """Ops of several outputs that work row by row, every output cut on axis 0 as the rows
    are: a split or an unstack along another axis than the rows (an LSTM cell's gates, an
    RNN's time steps), a softmax cross-entropy (its loss and its gradient). Not the cuts
    fastt made."""
    rows = {t.shape[0] if t.shape else None for t in op.outputs}
    if op.meta.split_of is not None or len(rows) != 1 or None in rows:
        return []
    t, first = op.type, op.outputs[0].shape
    if (t, len(op.inputs)) in (("Split", 2), ("SplitV", 3)):
        v, a = (1, 0) if t == "Split" else (0, 2)  # (split_dim, value), (value, sizes, axis)
        x, dim = graph.tensor(op.inputs[v]).shape, _const(graph, op, a)
        ok = x is not None and isinstance(dim, int) and dim % len(x) != 0 and \
            _rows_kept(graph, op.inputs[v:v + 1], first)
        cut = tuple(Part(SPLIT, 0) if i == v else Part(FULL) for i in range(len(op.inputs)))
        return [SplitRule("batch", cut, "concat", 0)] if ok else []
    if t == "Unpack" and len(op.inputs) == 1:
        x = graph.tensor(op.inputs[0]).shape
        ok = x is not None and int(op.attrs.get("axis", 0)) % len(x) != 0 and \
            _rows_kept(graph, op.inputs, first)
        return [SplitRule("batch", (Part(SPLIT, 0),), "concat", 0)] if ok else []
    if t in ("SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits") and \
            len(op.inputs) == 2 and _rows_kept(graph, op.inputs, first):  # (logits, labels)
        return [SplitRule("batch", (Part(SPLIT, 0), Part(SPLIT, 0)), "concat", 0)]
    return []


def _batch_local(op: Op, graph: Graph) -> list[SplitRule]:
    """Reductions, transposes and expand/squeeze that keep axis 0 where it is, or (a Sum over
    axis 0) reduce it: split on axis 0, join by concat or by sum."""
    x = graph.tensor(op.inputs[0]).shape if op.inputs else None
    if not x or x[0] is None or x[0] < 2:
        return []
    if op.type == "Squeeze":
        dims = op.attrs.get("squeeze_dims") or []
        return [] if not dims or 0 in dims or -len(x) in dims else \
            [SplitRule("batch", (Part(SPLIT, 0),), "concat", 0)]
    arg = _const(graph, op, 1)
    if arg is None:
        return []
    axes = [a % len(x) for a in (arg if isinstance(arg, list) else [arg])] if x else []
    full = (Part(SPLIT, 0), Part(FULL))
    if op.type == "Transpose":
        return [SplitRule("batch", full, "concat", 0)] if axes and axes[0] == 0 else []
    if op.type == "ExpandDims":
        return [SplitRule("batch", full, "concat", 0)] if arg not in (0, -len(x) - 1) else []
    if 0 not in axes:
        return [SplitRule("batch", full, "concat", 0)]
    return [SplitRule("batch", full, "sum", -1)] if op.type == "Sum" else []


def _concat(op: Op, graph: Graph) -> list[SplitRule]:
    """A concat along an axis other than 0 of tensors of one leading extent: cut them all
    on axis 0."""
    axis, out = _const(graph, op, len(op.inputs) - 1), op.outputs[0].shape
    if not isinstance(axis, int) or not out or out[0] is None or out[0] < 2 or \
            axis % len(out) == 0:
        return []
    for ref in op.inputs[:-1]:
        shape = graph.tensor(ref).shape
        if not shape or len(shape) != len(out) or shape[0] != out[0]:
            return []
    return [SplitRule("batch", (Part(SPLIT, 0),) * (len(op.inputs) - 1) + (Part(FULL),),
                      "concat", 0)]


def _keeps_rows(graph: Graph, op: Op) -> bool:
    """Whether ``op`` (a Slice or a Tile) outputs as many rows as its input has: then it
    takes every row (begin 0, multiple 1 on axis 0) and works row by row."""
    src, out = graph.tensor(op.inputs[0]).shape, op.outputs[0].shape
    if not src or not out or len(src) != len(out):
        return False
    return src[0] is not None and src[0] > 1 and src[0] == out[0]


def _elementwise(op: Op, graph: Graph) -> list[SplitRule]:
    """Batch split of an element-wise op: full-rank inputs are cut on axis 0, broadcast ones
    (lower rank, or leading dimension 1) are passed whole."""
    out = op.outputs[0].shape
    if not out or out[0] is None or out[0] < 2 or op.type in ("Softmax", "LogSoftmax") \
            and len(out) < 2:
        return []
    parts = []
    for ref in op.inputs:
        shape = graph.tensor(ref).shape
        if shape is None:
            return []
        if len(shape) == len(out) and shape[0] == out[0]:
            parts.append(Part(SPLIT, 0))
        elif len(shape) < len(out) or shape[0] == 1:
            parts.append(Part(FULL))
        else:
            return []
    return [SplitRule("batch", tuple(parts), "concat", 0)]


def find(op: Op, graph: Graph, dim: str) -> SplitRule | None:
    return next((r for r in rules(op, graph) if r.dim == dim), None)


def part_sizes(extent: int, n: int) -> list[int]:
    """``n`` near-equal sizes summing to ``extent`` (the first ones one larger)."""
    base, extra = divmod(extent, n)
    return [base + (1 if k < extra else 0) for k in range(n)]
