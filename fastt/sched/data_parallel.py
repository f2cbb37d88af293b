"""The data-parallel graph on the IR: FastT's starting point when the model fits one device.

``data_parallel(graph, n)`` cuts the batch into n near-equal shares and splits every op that
depends on the batch and has an exact batch rule, in topological order, so that the replicas
chain sub-op to sub-op (replica k = the ops ``X/part{k}``). Weight gradients split on the batch
are summed (``AddN``) before the single update; a sum of such gradients (a weight used at
every time step, a tied embedding) is summed within each replica first, as towers do, so only
one partial gradient per weight leaves a replica; ops without an exact batch rule (BatchNorm's
batch statistics, a loss reduced over the batch) run once on the whole batch behind a join, so
the graph computes what the original computes. ``Shape``/``Size``/``Rank`` of tensors whose
shape is static are folded into constants first, as grappler does.
"""
from __future__ import annotations

import math
from collections import Counter

from fastt.errors import FasttError
from fastt.ir import Graph, Op, TensorRef, TensorSpec
from fastt.sched.split_rules import FULL, PARTIAL, SHAPE, SPLIT, Part, SplitRule, part_sizes, \
    rules
from fastt.sched.splitting import apply_decisions

BATCH_SOURCES = frozenset({"Placeholder", "PlaceholderWithDefault", "IteratorGetNext"})
_SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})
_STOP = ("Apply", "Assign", "Scatter")  # updates of variables: the replicas end before them
# linear: applied to a sum of parts, they are applied part by part
_LINEAR = frozenset({"AddN", "Add", "AddV2", "Identity"})


def batch_size(graph: Graph) -> int:
    """The batch size: the most common leading dimension of the graph's input tensors."""
    dims = Counter(t.shape[0] for op in graph if op.type in BATCH_SOURCES for t in op.outputs
                   if t.shape and t.shape[0] is not None and t.shape[0] > 1)
    if not dims:
        raise FasttError("cannot find the batch: no input (placeholder or iterator) has a "
                         "known leading dimension")
    return dims.most_common(1)[0][0]


def fold_static_shapes(graph: Graph) -> Graph:
    """Replace Shape/ShapeN/Size/Rank of fully known tensors by constants (a ShapeN by an
    IdentityN of one constant per output, so its consumers keep their output indices)."""
    ops: list[Op] = []
    folded = 0
    for op in graph:
        shapes = [graph.tensor(r).shape for r in op.inputs]
        if op.type not in _SHAPE_OPS or not shapes or \
                any(sh is None or None in sh for sh in shapes):
            ops.append(op)
            continue
        folded += 1
        values = [list(sh) if op.type in ("Shape", "ShapeN") else
                  (math.prod(sh) if op.type == "Size" else len(sh)) for sh in shapes]
        consts = [Op(name=op.name if op.type != "ShapeN" else f"{op.name}/folded{i}",
                     type="Const", outputs=(TensorSpec(t.dtype, t.shape),),
                     control_inputs=op.control_inputs, device=op.device,
                     attrs={"value": v, "dtype": t.dtype, "_fastt_folded": op.type})
                  for i, (v, t) in enumerate(zip(values, op.outputs))]
        ops.extend(consts)
        if op.type == "ShapeN":
            ops.append(Op(name=op.name, type="IdentityN", outputs=op.outputs, device=op.device,
                          inputs=tuple(TensorRef(c.name, 0) for c in consts),
                          attrs={"_fastt_folded": op.type}))
    return Graph(ops, name=graph.name, payload=graph.payload) if folded else graph


def _batch_ops(graph: Graph) -> list[str]:
    """Ops downstream of the batch inputs, up to (excluding) the variable updates."""
    seen: set[str] = set()
    for name in graph.topological_order():
        op = graph[name]
        if op.type in BATCH_SOURCES or (any(r.op in seen for r in op.inputs)
                                        and not any(k in op.type for k in _STOP)):
            seen.add(name)
    return [n for n in graph.topological_order() if n in seen and graph[n].type
            not in BATCH_SOURCES]


def _batch_rule(op: Op, graph: Graph, axis: dict[str, int], B: int) -> SplitRule | None:
    """The rule that cuts every batch-carrying input on its batch axis. Other inputs pass
    whole, or are cut where they are batch-shaped (the seed of a mean loss's gradient, a
    [B] tensor that does not descend from the inputs, is cut like the activations it meets)."""
    for rule in rules(op, graph):
        ok, split_any = True, False
        for part, ref in zip(rule.inputs, op.inputs):
            a = axis.get(f"{ref.op}:{ref.index}")
            if a is None:
                shape = graph.tensor(ref).shape
                ok = part.kind == FULL or (part.kind == SHAPE and part.axis == 0) or (
                    part.kind == SPLIT and shape is not None and part.axis < len(shape)
                    and bool(shape[part.axis]) and shape[part.axis] % B == 0)
            else:
                ok = part.kind == SPLIT and part.axis == a
                split_any = True
            if not ok:
                break
        extent = rule.base(op, graph)
        if ok and split_any and extent and extent % B == 0:
            return rule
    return None


def data_parallel(graph: Graph, n: int) -> Graph:
    """The graph with the batch cut into ``n`` shares (see the module docstring)."""
    if n < 2:
        return graph
    graph = fold_static_shapes(graph)
    B = batch_size(graph)
    if B < n:
        raise FasttError(f"batch of {B} cannot be shared by {n} replicas")
    shares = part_sizes(B, n)
    axis: dict[str, int] = {}  # tensor -> its batch axis (extent a multiple of B)
    for op in graph:
        if op.type in BATCH_SOURCES:
            for i, t in enumerate(op.outputs):
                if t.shape and t.shape[0] == B:
                    axis[f"{op.name}:{i}"] = 0
    decisions: dict[str, tuple[SplitRule, list[int]]] = {}
    for name in _batch_ops(graph):
        op = graph[name]
        rule = _batch_rule(op, graph, axis, B) or _sum_of_partials(op, decisions, shares)
        if rule is not None:
            decisions[name] = (rule, shares)
            if rule.join == "concat":
                axis[f"{name}:0"] = rule.out_axis
        else:  # runs whole; its outputs still carry the batch on axis 0 when sized so
            for i, t in enumerate(op.outputs):
                if t.shape and t.shape[0] and t.shape[0] % B == 0 and any(
                        f"{r.op}:{r.index}" in axis for r in op.inputs):
                    axis[f"{name}:{i}"] = 0
    return apply_decisions(graph, decisions)


def _sum_of_partials(op: Op, decisions: dict[str, tuple[SplitRule, list[int]]],
                     shares: list[int]) -> SplitRule | None:
    """A sum (or identity) whose every input is a sum of the replicas' parts: computed replica
    by replica."""
    if op.type not in _LINEAR or len(op.outputs) != 1 or not op.inputs:
        return None
    for r in op.inputs:
        d = decisions.get(r.op)
        if r.index or d is None or d[0].join != "sum" or d[1] != shares:
            return None
    return SplitRule(PARTIAL, tuple(Part(PARTIAL) for _ in op.inputs), "sum", -1)


def replica_of(op: Op) -> int | None:
    """Replica index of a sub-op made by ``data_parallel`` (None for shared ops)."""
    if "_fastt_origin" not in op.attrs:
        return None
    tail = op.name.rsplit("/part", 1)
    return int(tail[1]) if len(tail) == 2 and tail[1].isdigit() else None
