"""The data-parallel graph on the IR: FastT's starting point when the model fits one device.

``data_parallel(graph, n)`` cuts the batch into n near-equal shares and splits every op that
depends on the batch and has an exact batch rule, in topological order, so that the replicas
chain sub-op to sub-op (replica k = the ops ``X/part{k}``). Weight gradients split on the batch
are summed (``AddN``) before the single update; a sum of such gradients (a weight used at
every time step, a tied embedding) is summed within each replica first, as towers do, so only
one partial gradient per weight leaves a replica; ops without an exact batch rule (a loss
reduced over the batch) run once on the whole batch behind a join, so the graph computes what
the original computes; BatchNorm in training normalises each replica's rows with the whole
batch's statistics, combined from the replicas' own (``sync_batch_norm``). Gates (``NoOp``s
waiting for replicas' ops) and constants get one copy per replica (``replicas``).
``Shape``/``Size``/``Rank`` of tensors whose shape is static are folded into constants, as
grappler does; those of tensors that carry the batch read it at run time from a batch input,
so the graph runs at any batch size.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Collection

from fastt.errors import NoBatch
from fastt.ir import Graph, Op, OpMeta, TensorRef, TensorSpec
from fastt.op_types import (BATCH_SOURCES, DATA_SIZED, LINEAR, MAYBE_BATCH, READS,
                             SHAPE_OPS)
from fastt.passes import replicas, sync_batch_norm
from fastt.passes.split_rules import (FULL, PARTIAL, SEVERAL, SHAPE, SPLIT, Part, SplitRule,
                                     part_sizes, rules)
from fastt.passes.splitting import apply_decisions

#: An op fastt made: the shape (or size, with ``size``) of a tensor that carries the batch,
#: ``value`` with entry ``axis`` read at run time: ``multiple`` times the batch of its input,
#: the Shape of a batch input (exported as a few small ops).
BATCH_SHAPE = "FasttBatchShape"
_STOP = ("Apply", "Assign", "Scatter")  # updates of variables: the replicas end before them


def batch_inputs(graph: Graph) -> tuple[int, list[TensorRef]] | None:
    """The batch size of a training step and the tensors that bring the batch into it
    (leading dimension = the batch), or None when none is found.

    The batch is the most common leading dimension (above 1) of the step's data: the outputs
    of placeholders, iterators, queue dequeues and ``py_func``s; when none has one, of its
    synthetic data: constants, random ops and reads of variables no op of the step updates
    (rank 2 or more decides; labels of rank 1 then join).
    """
    updated = {op.inputs[0].op for op in graph
               if op.inputs and any(k in op.type for k in _STOP)}
    first: list[tuple[TensorRef, int, int]] = []  # (tensor, leading dimension, rank)
    second: list[tuple[TensorRef, int, int]] = []
    for op in graph:
        if op.type in BATCH_SOURCES:
            tier = first
        elif op.type in MAYBE_BATCH or (op.type in READS and op.inputs and
                                         graph[op.inputs[0].op].is_variable and
                                         op.inputs[0].op not in updated):
            tier = second
        else:
            continue
        for i, t in enumerate(op.outputs):
            rows = t.shape[0] if t.shape else None
            if t.shape and rows is not None and rows > 1 and not (
                    op.type == "Const" and len(t.shape) == 1 and t.dtype == "int32"):
                tier.append((TensorRef(op.name, i), rows, len(t.shape)))
    for tier, rank in ((first, 1), (second, 2)):
        dims = Counter(rows for _, rows, r in tier if r >= rank)
        if dims:
            B = dims.most_common(1)[0][0]
            return B, [ref for ref, rows, _ in tier if rows == B]
    return None


def batch_size(graph: Graph) -> int:
    """The batch size (see ``batch_inputs``); ``NoBatch`` when there is none."""
    return _batch(graph)[0]


def _batch(graph: Graph) -> tuple[int, list[TensorRef]]:
    found = batch_inputs(graph)
    if found is None:
        raise NoBatch("cannot find the batch: no input of the step (placeholder, iterator, "
                         "queue, py_func, constant, random op or data variable) has a known "
                         "leading dimension")
    return found


def fold_static_shapes(graph: Graph, batch: dict[str, tuple[TensorRef, int, int]] | None = None
                       ) -> Graph:
    """Replace Shape/ShapeN/Size/Rank of fully known tensors by constants (a ShapeN by an
    IdentityN of one constant per output, so its consumers keep their output indices).

    ``batch`` maps a tensor that carries the batch to (a batch input it descends from, its
    batch axis, its extent there over the batch): the shape of such a tensor is not constant
    but read at run time from that input's batch (a ``BATCH_SHAPE`` op), so that the graph
    runs at any batch size without materialising the tensor.
    """
    batch = batch or {}
    ops: list[Op] = []
    folded = 0
    shape_of: dict[TensorRef, str] = {}  # batch input -> its Shape op
    sized = data_sized(graph)
    for op in graph:
        dims = [graph.tensor(r).dims for r in op.inputs]
        shapes = [sh for sh in dims if sh is not None]
        if op.type not in SHAPE_OPS or not shapes or op.meta.dynamic or \
                len(shapes) < len(dims) or any(r.op in sized for r in op.inputs):
            ops.append(op)
            continue
        folded += 1
        made = []
        for i, (ref, sh, t) in enumerate(zip(op.inputs, shapes, op.outputs)):
            name = op.name if op.type != "ShapeN" else f"{op.name}/folded{i}"
            carried = batch.get(str(ref)) if op.type != "Rank" else None
            if carried is None:
                value = list(sh) if op.type in ("Shape", "ShapeN") else \
                    (math.prod(sh) if op.type == "Size" else len(sh))
                # the tensor's producer stays before it, as grappler keeps it: a Shape can
                # be all that orders it before what reads the shape (Fill(Shape(loss)) the
                # loss, and a penalty on a variable in it, before the variable's update)
                after = op.control_inputs + (() if ref.op in op.control_inputs else (ref.op,))
                made.append(Op(name=name, type="Const", outputs=(TensorSpec(t.dtype, t.shape),),
                               control_inputs=after, device=op.device,
                               attrs={"value": value, "dtype": t.dtype},
                               meta=OpMeta(folded=op.type)))
                continue
            src, axis, multiple = carried
            if src not in shape_of:
                shape_of[src] = f"{src.op}/fastt_shape{src.index}"
                spec = graph.tensor(src)
                ops.append(Op(name=shape_of[src], type="Shape", inputs=(src,),
                              outputs=(TensorSpec("int32", (len(spec.shape or ()),)),),
                              colocate_with=(src.op,),
                              attrs={"T": spec.dtype, "out_type": "int32"},
                              meta=OpMeta(dynamic=True)))
            made.append(Op(name=name, type=BATCH_SHAPE,
                           inputs=(TensorRef(shape_of[src], 0),),
                           outputs=(TensorSpec(t.dtype, t.shape),),
                           control_inputs=op.control_inputs, device=op.device,
                           attrs={"value": list(sh), "axis": axis, "multiple": multiple,
                                  "size": op.type == "Size", "dtype": t.dtype},
                           meta=OpMeta(folded=op.type)))
        ops.extend(made)
        if op.type == "ShapeN":
            ops.append(Op(name=op.name, type="IdentityN", outputs=op.outputs, device=op.device,
                          inputs=tuple(TensorRef(c.name, 0) for c in made),
                          meta=OpMeta(folded=op.type)))
    return Graph(ops, name=graph.name, meta=graph.meta, like=graph) if folded else graph


def data_sized(graph: Graph) -> set[str]:
    """The ops whose output sizes depend on values the step computes: the ``DATA_SIZED`` ops
    (``Unique`` of a sparse gradient's indices) and every op downstream of one. O(ops +
    edges)."""
    out: set[str] = set()
    for op in graph:  # topological order
        if op.type in DATA_SIZED or any(r.op in out for r in op.inputs):
            out.add(op.name)
    return out


def _batch_descent(graph: Graph, inputs: list[TensorRef], axis: dict[str, int], B: int
                   ) -> dict[str, tuple[TensorRef, int, int]]:
    """Tensor -> (a batch input it descends from, its batch axis, its extent there / B) for
    the tensors that carry the batch (``axis``)."""
    origin: dict[str, TensorRef] = {r.op: r for r in inputs}
    for name in graph.topological_order():
        if name not in origin:
            found = next((origin[r.op] for r in graph[name].inputs if r.op in origin), None)
            if found is not None:
                origin[name] = found
    out = {}
    for t, a in axis.items():
        ref = TensorRef.parse(t)
        op_name = ref.op
        extent = (graph.tensor(ref).shape or ())[a]
        if op_name in origin and extent and extent % B == 0:
            out[t] = (origin[op_name], a, extent // B)
    return out


def batch_ops(graph: Graph) -> list[str]:
    """The ops of a step that carry its batch (``batch_inputs``), in topological order, up
    to (excluding) the variable updates; none when it has no batch."""
    found = batch_inputs(graph)
    return _batch_ops(graph, {r.op for r in found[1]}) if found else []


def _batch_ops(graph: Graph, sources: set[str]) -> list[str]:
    """Ops downstream of the batch inputs (ops ``sources``), up to (excluding) the variable
    updates."""
    seen: set[str] = set()
    for name in graph.topological_order():
        op = graph[name]
        if name in sources or (any(r.op in seen for r in op.inputs)
                               and not any(k in op.type for k in _STOP)):
            seen.add(name)
    return [n for n in graph.topological_order() if n in seen and n not in sources]


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
                dim = shape[part.axis] if shape is not None and part.axis < len(shape) else None
                ok = part.kind == FULL or (part.kind == SHAPE and part.axis == 0) or (
                    part.kind == SPLIT and dim is not None and dim != 0 and dim % B == 0)
            else:
                ok = part.kind == SPLIT and part.axis == a
                split_any = True
            if not ok:
                break
        extent = rule.base(op, graph)
        if ok and split_any and extent and extent % B == 0:
            return rule
    return None


def data_parallel(graph: Graph, n: int, whole: Collection[str] = ()) -> Graph:
    """The graph with the batch cut into ``n`` shares (see the module docstring); the ops
    named in ``whole`` run once on the whole batch, as ops without a batch rule do (a weight
    kept whole: ``fastt.passes.hybrid``)."""
    if n < 2:
        return graph
    B, inputs = _batch(graph)
    if B < n:
        raise NoBatch(f"batch of {B} cannot be shared by {n} replicas")
    shares = part_sizes(B, n)
    axis = {str(r): 0 for r in inputs}  # tensor -> its batch axis (extent a multiple of B)
    decisions: dict[str, tuple[SplitRule, list[int]]] = {}
    for name in _batch_ops(graph, {r.op for r in inputs}):
        op = graph[name]
        rule = None if name in whole else (
            _sync_rule(op, graph, axis, B, decisions) or _batch_rule(op, graph, axis, B) or
            _sum_of_partials(op, decisions, shares))
        if rule is not None:
            decisions[name] = (rule, shares)
            if rule.join == "concat":
                for i in range(len(op.outputs) if op.type in SEVERAL else 1):
                    axis[f"{name}:{i}"] = rule.out_axis
        elif op.type not in SHAPE_OPS:  # runs whole; its outputs still carry the batch on
            for i, t in enumerate(op.outputs):  # axis 0 when sized so
                if t.shape and t.shape[0] and t.shape[0] % B == 0 and any(
                        f"{r.op}:{r.index}" in axis for r in op.inputs):
                    axis[f"{name}:{i}"] = 0
    graph = fold_static_shapes(graph, _batch_descent(graph, inputs, axis, B))
    graph = replicas.gates_per_replica(apply_decisions(graph, decisions), n)
    return replicas.shared_control_gates(replicas.constants_per_replica(graph))


def _sync_rule(op: Op, graph: Graph, axis: dict[str, int], B: int,
               decisions: dict[str, tuple[SplitRule, list[int]]]) -> SplitRule | None:
    """A batch norm in training (or its gradient, when its batch norm was split so) whose
    rows carry the batch: split with the whole batch's statistics (``sync_batch_norm``)."""
    if not op.inputs or axis.get(str(op.inputs[0])) != 0:
        return None
    rows = (graph.tensor(op.inputs[0]).shape or (None,))[0]
    if not rows or rows % B:
        return None
    return sync_batch_norm.forward_rule(op, graph) or sync_batch_norm.gradient_rule(
        op, lambda fwd: fwd in decisions and decisions[fwd][0].dim == sync_batch_norm.SYNC)


def _sum_of_partials(op: Op, decisions: dict[str, tuple[SplitRule, list[int]]],
                     shares: list[int]) -> SplitRule | None:
    """A sum (or identity) whose every input is a sum of the replicas' parts: computed replica
    by replica."""
    if op.type not in LINEAR or len(op.outputs) != 1 or not op.inputs:
        return None
    for r in op.inputs:
        d = decisions.get(r.op)
        if r.index or d is None or d[0].join != "sum" or d[1] != shares:
            return None
    return SplitRule(PARTIAL, tuple(Part(PARTIAL) for _ in op.inputs), "sum", -1)
