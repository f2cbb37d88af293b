"""SplitOperation (FastT, Algorithm 2): replace an op by n sub-ops, as a pass on the IR.

``split_operation(graph, op, dim, n)`` returns a new graph where op ``X`` became sub-ops
``X/part{k}`` (same type and attributes, ``_fastt_origin`` = X, ``_fastt_fraction`` = their
share of the work), fed by ``SplitV`` ops (or the whole tensor, or a per-part shape ``Const``)
and joined by a ``ConcatV2`` or ``AddN`` that keeps the name ``X``, so that X's consumers and
anyone fetching X see the same value. A split input whose producer is a join of the same cut
is wired sub-op to sub-op (no concat -> split); a join whose consumers were all rewired so is
dropped from the planning graph (the rewriter rebuilds it if the user fetches it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastt.errors import FasttError
from fastt.ir import Graph, Op, TensorRef, TensorSpec
from fastt.sched.split_rules import FULL, SPLIT, find, part_sizes

JOIN_ATTR = "_fastt_join"  # on a join: {"kind": "concat"|"sum", "axis": a, "sizes": [...]}


@dataclass(frozen=True)
class Split:
    """One entry of the split list: ``(op name, dimension, number of parts)``."""
    op: str
    dim: str
    n: int

    def to_list(self) -> list[Any]:
        return [self.op, self.dim, self.n]


def _with_axis(shape: tuple[int | None, ...], axis: int, size: int) -> tuple[int | None, ...]:
    return tuple(size if k == axis else d for k, d in enumerate(shape))


def _cut(graph: Graph, ref: TensorRef, axis: int, sizes: list[int], new_ops: list[Op],
         owner: str, i: int, rewired: set[str]) -> list[TensorRef]:
    """The n parts of tensor ``ref`` cut along ``axis``: the producer's own parts when it is a
    join of the same cut (noted in ``rewired``), else the outputs of a new ``SplitV`` op."""
    producer = graph[ref.op]
    join = producer.attrs.get(JOIN_ATTR)
    if join and join["kind"] == "concat" and join["axis"] == axis and join["sizes"] == sizes:
        rewired.add(ref.op)
        return [TensorRef(f"{ref.op}/part{k}", 0) for k in range(len(sizes))]
    spec = graph.tensor(ref)
    if spec.shape is None or axis >= len(spec.shape) or spec.shape[axis] != sum(sizes):
        raise FasttError(f"cannot split input {i} of {owner!r} ({spec.shape}) on axis {axis} "
                         f"into {sizes}")
    name = f"{owner}/split_in{i}"
    new_ops.append(Op(name=name, type="SplitV", inputs=(ref,),
                      outputs=tuple(TensorSpec(spec.dtype, _with_axis(spec.shape, axis, s))
                                    for s in sizes),
                      attrs={"axis": axis, "size_splits": list(sizes),
                             "_fastt_split_of": owner}))
    return [TensorRef(name, k) for k in range(len(sizes))]


def split_operation(graph: Graph, name: str, dim: str, n: int) -> Graph:
    """The graph with op ``name`` split on dimension ``dim`` into ``n`` sub-ops."""
    op = graph[name]
    rule = find(op, graph, dim)
    if rule is None:
        raise FasttError(f"op {name!r} ({op.type}) cannot be split on {dim!r}")
    extent = rule.extent(op, graph)
    if extent is None or n < 2 or extent < n:
        raise FasttError(f"op {name!r}: dimension {dim!r} of size {extent} cannot be cut "
                         f"into {n} parts")
    sizes = part_sizes(extent, n)
    new_ops: list[Op] = []
    per_input: list[list[TensorRef]] = []
    rewired: set[str] = set()
    for i, (part, ref) in enumerate(zip(rule.inputs, op.inputs)):
        if part.kind == SPLIT:
            per_input.append(_cut(graph, ref, part.axis, sizes, new_ops, name, i, rewired))
        elif part.kind == FULL:
            per_input.append([ref] * n)
        else:
            per_input.append(_shape_consts(op, ref, part.axis, sizes, new_ops, i))
    out = op.outputs[0]
    parts = []
    for k in range(n):
        shape = _with_axis(out.shape, rule.out_axis, sizes[k]) if rule.join == "concat" \
            else out.shape
        parts.append(op.with_(
            name=f"{name}/part{k}", inputs=tuple(per_input[i][k] for i in range(len(op.inputs))),
            outputs=(TensorSpec(out.dtype, shape),),
            attrs={**op.attrs, "_fastt_origin": op.attrs.get("_fastt_origin", name),
                   "_fastt_fraction": op.attrs.get("_fastt_fraction", 1.0) * sizes[k] / extent}))
    join_spec = {"kind": rule.join, "axis": rule.out_axis, "sizes": sizes}
    join = Op(name=name, type="ConcatV2" if rule.join == "concat" else "AddN",
              inputs=tuple(TensorRef(p.name, 0) for p in parts), outputs=op.outputs,
              device=op.device, attrs={JOIN_ATTR: join_spec, "axis": rule.out_axis,
                                       "N": n, "_fastt_split_of": name})
    ops: list[Op] = []
    for o in graph:
        if o.name == name:
            ops.extend(new_ops)
            ops.extend(parts)
            ops.append(join)
        else:
            ops.append(o)
    new = Graph(ops, name=graph.name, payload=graph.payload)
    dead = {j for j in rewired if not new.consumers(j) and not new.control_successors(j)}
    return Graph((o for o in new if o.name not in dead), name=graph.name,
                 payload=graph.payload) if dead else new


def _shape_consts(op: Op, ref: TensorRef, axis: int, sizes: list[int],
                  new_ops: list[Op], i: int) -> list[TensorRef]:
    """Per-part shape vectors for a shape input (Conv2DBackpropInput's input_sizes, ...): the
    vector is the op's own output shape, known statically, with entry ``axis`` shrunk."""
    shape = op.outputs[0].shape
    if shape is None or any(d is None for d in shape):
        raise FasttError(f"op {op.name!r}: its output shape must be known to split it")
    dtype = "int32"
    refs = []
    for k, s in enumerate(sizes):
        name = f"{op.name}/shape_in{i}_{k}"
        new_ops.append(Op(name=name, type="Const", outputs=(TensorSpec(dtype, (len(shape),)),),
                          attrs={"value": [s if a == axis else d for a, d in enumerate(shape)],
                                 "dtype": dtype}))
        refs.append(TensorRef(name, 0))
    return refs


def apply_splits(graph: Graph, splits: list[Split]) -> Graph:
    """Apply a split list in order (what a strategy's ``splits`` mean)."""
    for s in splits:
        graph = split_operation(graph, s.op, s.dim, s.n)
    return graph
