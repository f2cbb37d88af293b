"""SplitOperation (FastT, Algorithm 2): replace an op by n sub-ops, as a pass on the IR.

``split_operation(graph, op, dim, n)`` returns a new graph where op ``X`` became sub-ops
``X/part{k}`` (same type and attributes, ``meta.origin`` = X, ``meta.fraction`` = their
share of the work), fed by ``SplitV`` ops whose sizes follow the input's extent at run time
(or the whole tensor, or a per-part shape vector, ``PART_SHAPE``)
and joined by a ``ConcatV2`` or ``AddN`` that keeps the name ``X``, so that X's consumers and
anyone fetching X see the same value. A split input whose producer is a join of the same cut
is wired sub-op to sub-op (no concat -> split); a control dependency on a split op becomes one
on all its parts. A join that nothing reads any more is dropped from the planning graph (the
rewriter rebuilds it if the user fetches it). Part k of an
op colocated with op Y (``_class: loc:@Y``, e.g. a gradient with its forward op) is colocated
with part k of Y where Y was split alike; otherwise the hint is dropped.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, cast

from fastt.errors import FasttError
from fastt.ir import Graph, Op, OpMeta, TensorRef, TensorSpec, tensor_spec
from fastt.passes import sync_batch_norm
from fastt.passes.split_rules import FULL, PARTIAL, SHAPE, SPLIT, SplitRule, find, part_sizes

#: An op fastt made: a shape vector, ``value`` with entry ``axis`` set at run time to the
#: extent of its input on ``like_axis`` times ``num / den`` (exported as a few small ops).
PART_SHAPE = "FasttPartShape"


@dataclass(frozen=True)
class Split:
    """One entry of the split list: ``(op name, dimension, number of parts)``. OS-DPOS also
    records why it split: the op's compute time before, the parameter bytes it reads, and the
    predicted step time before and after (these do not take part in equality)."""
    op: str
    dim: str
    n: int
    time_before_s: float | None = field(default=None, compare=False)
    param_bytes: int | None = field(default=None, compare=False)
    step_before_s: float | None = field(default=None, compare=False)
    step_after_s: float | None = field(default=None, compare=False)

    def to_list(self) -> list[Any]:
        return [self.op, self.dim, self.n]

    def details(self) -> dict[str, Any]:
        return {"op": self.op, "dim": self.dim, "n": self.n,
                "time_before_s": self.time_before_s, "param_bytes": self.param_bytes,
                "step_before_s": self.step_before_s, "step_after_s": self.step_after_s}


def parameter_bytes(graph: Graph, op: Op) -> int:
    """Bytes of the variables ``op`` reads directly (through Identity/ReadVariableOp)."""
    total = 0
    for ref in op.inputs:
        src = graph[ref.op]
        while not src.is_variable and src.type in ("Identity", "ReadVariableOp") and src.inputs:
            src = graph[src.inputs[0].op]
        if src.is_variable:
            spec = graph.tensor(ref)
            total += spec.nbytes or 0
    return total


def _with_axis(shape: tuple[int | None, ...], axis: int, size: int) -> tuple[int | None, ...]:
    return tuple(size if k == axis else d for k, d in enumerate(shape))


def scaled(shares: list[int], extent: int | None, what: str) -> list[int]:
    """``shares`` rescaled to a tensor axis of ``extent`` (which must be a multiple)."""
    total = sum(shares)
    if extent is None or extent % total:
        raise FasttError(f"{what}: an axis of {extent} cannot be cut in shares {shares}")
    return [s * (extent // total) for s in shares]


class _Builder:
    """Applies split decisions to a graph in one pass (producers before consumers)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.joins = {o.name: o.meta.join for o in graph if o.meta.join is not None}
        self.split_names: set[str] = set()  # ops split in this pass (their parts exist)
        self.rewired: set[str] = set()
        # outputs of ops replaced by a synchronised batch norm -> the tensors holding them
        self.renamed: dict[TensorRef, TensorRef] = {}
        self.helpers: dict[str, list[str]] = {}  # a join -> the ops only it reads (concats)
        # (tensor, axis, part sizes, total of the shares) -> its parts
        self.cuts: dict[tuple[TensorRef, int, tuple[int, ...], int], list[TensorRef]] = {}

    def cut(self, ref: TensorRef, axis: int, shares: list[int], out: list[Op], owner: str,
            i: int) -> list[TensorRef]:
        """The parts of tensor ``ref`` cut along ``axis`` in proportion to ``shares``: the
        producer's own parts when it is a join of the same cut, else a new ``SplitV``."""
        spec = self.graph.tensor(ref)
        extent = spec.shape[axis] if spec.shape is not None and axis < len(spec.shape) else None
        sizes = scaled(shares, extent, f"input {i} of {owner!r}")
        join = self.joins.get(ref.op)
        if join and ref.index < join.get("outputs", 1) and join["kind"] == "concat" and \
                join["axis"] == axis and join["sizes"] == sizes and \
                join.get("total", sum(shares)) == sum(shares):
            self.rewired.add(ref.op)
            return [TensorRef(f"{ref.op}/part{k}", ref.index) for k in range(len(sizes))]
        key = (ref, axis, tuple(sizes), sum(shares))  # the same sizes at any batch
        if key in self.cuts:  # the same tensor cut the same way for another consumer
            return self.cuts[key]
        name = f"{owner}/split_in{i}"
        assert spec.shape is not None  # scaled() raised otherwise
        out.append(Op(name=name, type="SplitV", inputs=(ref,),
                      outputs=tuple(tensor_spec(spec.dtype, _with_axis(spec.shape, axis, s))
                                    for s in sizes),
                      attrs={"axis": axis, "size_splits": list(sizes), "shares": list(shares)},
                      meta=OpMeta(split_of=owner)))
        self.cuts[key] = [TensorRef(name, k) for k in range(len(sizes))]
        return self.cuts[key]

    def partials(self, ref: TensorRef, n: int, owner: str) -> list[TensorRef]:
        """The ``n`` partial sums whose sum is ``ref`` (its producer's parts)."""
        join = self.joins.get(ref.op)
        if ref.index or not join or join["kind"] != "sum" or len(join["sizes"]) != n:
            raise FasttError(f"op {owner!r}: input {ref.op!r} is not a sum of {n} parts")
        self.rewired.add(ref.op)
        return [TensorRef(f"{ref.op}/part{k}", 0) for k in range(n)]

    def expand(self, op: Op, rule: SplitRule, shares: list[int]) -> list[Op]:
        """The ops that replace ``op``: input cuts, the sub-ops and the join named like it."""
        name, n, total = op.name, len(shares), sum(shares)
        out: list[Op] = []
        if rule.dim == sync_batch_norm.SYNC:
            return self._sync(op, shares)
        per_input: list[list[TensorRef]] = []
        for i, (part, ref) in enumerate(zip(rule.inputs, op.inputs)):
            if part.kind == SPLIT:
                per_input.append(self.cut(ref, part.axis, shares, out, name, i))
            elif part.kind == FULL:
                per_input.append([ref] * n)
            elif part.kind == PARTIAL:
                per_input.append(self.partials(ref, n, name))
            else:
                per_input.append([])  # below: shapes follow the cut inputs
        for i, part in enumerate(rule.inputs):
            if part.kind == SHAPE:
                shape = op.outputs[0].shape
                sizes = scaled(shares, shape[part.axis] if shape else None, f"op {name!r}")
                like = next(((per_input[j], p.axis, self.graph.tensor(op.inputs[j]))
                             for j, p in enumerate(rule.inputs) if p.kind == SPLIT), None)
                per_input[i] = _part_shapes(op, part.axis, sizes, like, out, i)
        whole = op.outputs[0].shape
        out_sizes = scaled(shares, whole[rule.out_axis] if whole else None, f"op {name!r}") \
            if rule.join == "concat" else list(shares)
        parts = []
        for k in range(n):
            parts.append(op.with_(
                name=f"{name}/part{k}",
                inputs=tuple(per_input[i][k] for i in range(len(op.inputs))),
                outputs=tuple(tensor_spec(t.dtype, _with_axis(t.shape, rule.out_axis,
                                                              out_sizes[k])
                                          if rule.join == "concat" and t.shape is not None
                                          else t.shape) for t in op.outputs),
                colocate_with=tuple(f"{c}/part{k}" for c in op.colocate_with
                                    if c in self.split_names or f"{c}/part{k}" in self.graph),
                meta=replace(op.meta, origin=op.meta.origin or name,
                             fraction=op.meta.fraction * (
                                 1.0 if rule.dim == PARTIAL else shares[k] / total))))
        join_spec: dict[str, Any] = {"kind": rule.join, "axis": rule.out_axis,
                                     "sizes": out_sizes, "total": total}
        self.joins[name] = join_spec
        self.split_names.add(name)
        if len(op.outputs) > 1:  # each output's concat, behind an IdentityN named like op
            join_spec["outputs"] = len(op.outputs)
            concats = [Op(name=f"{name}/fastt_join{i}", type="ConcatV2", inputs=tuple(
                TensorRef(p.name, i) for p in parts), outputs=(t,), device=op.device,
                attrs={"axis": rule.out_axis, "N": n}, meta=OpMeta(split_of=name))
                for i, t in enumerate(op.outputs)]
            self.helpers[name] = [c.name for c in concats]
            return out + parts + concats + [Op(
                name=name, type="IdentityN", inputs=tuple(TensorRef(c.name, 0) for c in concats),
                outputs=op.outputs, device=op.device, meta=OpMeta(split_of=name, join=join_spec))]
        join = Op(name=name, type="ConcatV2" if rule.join == "concat" else "AddN",
                  inputs=tuple(TensorRef(p.name, 0) for p in parts), outputs=op.outputs,
                  device=op.device, attrs={"axis": rule.out_axis, "N": n},
                  meta=OpMeta(split_of=name, join=join_spec))
        return out + parts + [join]

    def _sync(self, op: Op, shares: list[int]) -> list[Op]:
        """A batch norm (or its gradient) on the replicas' rows with the whole batch's
        statistics (``sync_batch_norm``): the cut of its input, then its ops."""
        out: list[Op] = []
        parts = self.cut(op.inputs[0], 0, shares, out, op.name, 0)
        shape = self.graph.tensor(op.inputs[0]).shape
        rows = scaled(shares, shape[0] if shape else None, f"op {op.name!r}")
        expand = sync_batch_norm.expand_forward if op.type in sync_batch_norm.FORWARD \
            else sync_batch_norm.expand_gradient
        ops, renamed = expand(op, self.graph, parts, rows)
        if op.control_inputs:  # what the op waited for, its first ops wait for
            made = {o.name for o in ops}
            ops = [o if any(r.op in made for r in o.inputs) else o.with_(
                control_inputs=tuple(dict.fromkeys(o.control_inputs + op.control_inputs)))
                for o in ops]
        self.renamed.update(renamed)
        join = ops[-1]
        self.joins[op.name] = cast(dict[str, Any], join.meta.join)
        self.split_names.add(op.name)
        self.helpers[op.name] = [join.inputs[0].op]
        return out + ops

    def rename(self, op: Op) -> Op:
        """``op`` reading the tensors that now hold what it read (see ``renamed``)."""
        if not self.renamed or not any(r in self.renamed for r in op.inputs):
            return op
        return op.with_(inputs=tuple(self.renamed.get(r, r) for r in op.inputs))


def apply_decisions(graph: Graph, decisions: dict[str, tuple[SplitRule, list[int]]]) -> Graph:
    """Split every op named in ``decisions`` (rule, shares), in one pass over ``graph``."""
    builder = _Builder(graph)
    ops: list[Op] = []
    for name in graph.topological_order():
        op = graph[name]
        if any(c in builder.split_names for c in op.control_inputs):
            # Waiting for a split op means waiting for all its parts, not for its join.
            control: list[str] = []
            for c in op.control_inputs:
                n = len(builder.joins[c]["sizes"]) if c in builder.split_names else 0
                control.extend([f"{c}/part{k}" for k in range(n)] if n else [c])
                if n:
                    builder.rewired.add(c)
            op = op.with_(control_inputs=tuple(dict.fromkeys(control)))
        op = builder.rename(op)
        if name in decisions:
            ops.extend(builder.expand(op, *decisions[name]))
        else:
            ops.append(op)
    new = Graph(ops, name=graph.name, meta=graph.meta, like=graph)
    dead = new.unread(builder.rewired)
    dead |= {h for j, hs in builder.helpers.items() if j in dead for h in hs}  # its only readers
    if not dead:
        return new
    # Kept aside (not scheduled) so that the rewriter can rebuild them for a user's fetch.
    dropped = {**graph.meta.dropped_joins, **{j: new[j] for j in dead}}
    return Graph((o for o in new if o.name not in dead), name=graph.name,
                 meta=replace(graph.meta, dropped_joins=dropped))


def decide(graph: Graph, name: str, dim: str, n: int,
           shares: list[int] | None = None) -> tuple[SplitRule, list[int]]:
    """Check that op ``name`` can be split on ``dim`` into ``n``; its (rule, shares)."""
    op = graph[name]
    rule = find(op, graph, dim)
    if rule is None:
        raise FasttError(f"op {name!r} ({op.type}) cannot be split on {dim!r}")
    extent = rule.base(op, graph)
    if extent is None or n < 2 or extent < n:
        raise FasttError(f"op {name!r}: dimension {dim!r} of size {extent} cannot be cut "
                         f"into {n} parts")
    shares = shares or part_sizes(extent, n)
    if len(shares) != n or min(shares) < 1:
        raise FasttError(f"op {name!r}: {n} parts need {n} positive shares, got {shares}")
    return rule, shares


def split_operation(graph: Graph, name: str, dim: str, n: int,
                    shares: list[int] | None = None) -> Graph:
    """The graph with op ``name`` split on dimension ``dim`` into ``n`` sub-ops; ``shares``
    (default: near-equal parts of the dimension) fix the proportions of every cut tensor."""
    return apply_decisions(graph, {name: decide(graph, name, dim, n, shares)})


def _part_shapes(op: Op, axis: int, sizes: list[int],
                 like: tuple[list[TensorRef], int, TensorSpec] | None, new_ops: list[Op],
                 i: int) -> list[TensorRef]:
    """Per-part shape vectors for a shape input (Conv2DBackpropInput's input_sizes, a
    Reshape's shape, ...): the op's own output shape, known statically, whose entry ``axis``
    is that part's extent. The extent is read at run time from the part's cut input
    (``like``: the parts, their axis, the whole tensor), so that the parts follow the
    batch the step is run with; a Reshape simply takes -1 there."""
    known = op.outputs[0].shape
    if known is None or any(d is None for d in known):
        raise FasttError(f"op {op.name!r}: its output shape must be known to split it")
    shape = cast(tuple[int, ...], known)
    dtype = "int32"
    refs = []
    for k, s in enumerate(sizes):
        name = f"{op.name}/shape_in{i}_{k}"
        value = [s if a == axis else d for a, d in enumerate(shape)]
        spec = TensorSpec(dtype, (len(shape),))
        if op.type == "Reshape" or like is None:
            if op.type == "Reshape":
                value[axis] = -1
            new_ops.append(Op(name=name, type="Const", outputs=(spec,),
                              attrs={"value": value, "dtype": dtype}))
        else:
            parts, like_axis, whole = like
            extent = whole.shape[like_axis] if whole.shape else None
            if not extent:
                raise FasttError(f"op {op.name!r}: input cut on axis {like_axis} has no size")
            ratio = Fraction(shape[axis], extent)
            new_ops.append(Op(name=name, type=PART_SHAPE, inputs=(parts[k],), outputs=(spec,),
                              attrs={"value": value, "dtype": dtype, "axis": axis,
                                     "like_axis": like_axis, "num": ratio.numerator,
                                     "den": ratio.denominator,
                                     "T": whole.dtype.removesuffix("_ref")}))
        refs.append(TensorRef(name, 0))
    return refs


def apply_splits(graph: Graph, splits: list[Split]) -> Graph:
    """Apply a split list in order (what a strategy's ``splits`` mean)."""
    for s in splits:
        graph = split_operation(graph, s.op, s.dim, s.n)
    return graph
