"""Batch normalisation split on the batch with the whole batch's statistics (synchronised
BatchNorm), for data parallelism.

In training, a fused batch norm normalises each channel with the mean and biased variance of
the whole batch, and its gradient needs two sums over the whole batch. Cut on the batch, each
replica sums its own rows; the sums of the replicas' partial sums (channel vectors) give the
same statistics; each replica then normalises its rows, and computes its rows of the gradient,
with them. What crosses devices is a few channel vectors per replica, not the activations
(before, the op ran whole on one device behind a concat of every replica's rows). The moments
take two passes, as TensorFlow's CPU kernel does (the mean, then the mean of squared
deviations), so results agree up to the order of the sums::

    forward, replica k:  s_k = sum(x_k);  n = sum(size(x)) / C;  mean = sum(s) / n;
                         c_k = x_k - mean;  q_k = sum(c_k^2);  var = sum(q) / n;
                         f = scale * rsqrt(var + eps);  y_k = c_k * f + offset
    gradient, replica k: a_k = sum(dy_k);  b_k = sum(dy_k * c_k);
                         dx_k = (dy_k - sum(a)/n - c_k * (sum(b)/n) * rsqrt(var + eps)^2) * f
                         d_scale = sum(b) * rsqrt(var + eps);  d_offset = sum(a)

Every replica sums every replica's partial sums itself (the same ``AddN``, so the same
bits): a statistic takes one hop between devices, where a sum on one device would take two.
The vectors a replica sends at once travel packed in one message (s_k with its size; a_k with
b_k): three exchanges a batch norm, forward and gradient.
Each replica's ops on its rows share the fused op's work (``meta.fraction``).
"""
from __future__ import annotations

from typing import Callable

from fastt.ir import Graph, Op, OpMeta, TensorRef, TensorSpec
from fastt.sched.split_rules import FULL, SPLIT, Part, SplitRule

FORWARD = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})
GRADIENT = frozenset({"FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"})
SYNC = "sync"  # the SplitRule dimension of a synchronised batch norm
#: ``{batch norm}{SIZE}``: the size of its input, read at run time from the batch, when the
#: data-parallel pass could make one (each replica then counts the batch without asking)
SIZE = "/fastt_batch_size"
#: a gradient's x: the forward's centred parts c_k are reused instead
_FORWARD_RULE = SplitRule(SYNC, (Part(SPLIT, 0),) + (Part(FULL),) * 4, "concat", 0)
_GRADIENT_RULE = SplitRule(SYNC, (Part(SPLIT, 0),) + (Part(FULL),) * 5, "concat", 0)


def _channels(op: Op, graph: Graph) -> tuple[int, list[int]] | None:
    """(C, the axes reduced) of a 4-D float32 batch norm in training, or None."""
    shape = graph.tensor(op.inputs[0]).shape if op.inputs else None
    fmt = str(op.attrs.get("data_format", "NHWC"))
    if not op.attrs.get("is_training", True) or shape is None or len(shape) != 4 or \
            fmt not in ("NHWC", "NCHW") or op.attrs.get("T", "float32") != "float32" or \
            op.attrs.get("U", "float32") != "float32":
        return None
    c, axes = (shape[3], [0, 1, 2]) if fmt == "NHWC" else (shape[1], [0, 2, 3])
    return (c, axes) if c else None


def forward_rule(op: Op, graph: Graph) -> SplitRule | None:
    """The synchronised split of a fused batch norm in training, when it has one: five
    inputs, 4-D float32, the plain batch statistics out (``exponential_avg_factor`` 1), and
    its saved statistics read only by gradients of the same input (or ``zeros_like``)."""
    if op.type not in FORWARD or len(op.inputs) != 5 or _channels(op, graph) is None or \
            float(op.attrs.get("exponential_avg_factor", 1.0)) != 1.0:
        return None
    for e in graph.consumers(op.name):
        reader = graph[e.dst]
        if e.src_index >= 3 and not (reader.type == "ZerosLike" or (
                reader.type in GRADIENT and reader.inputs[1] == op.inputs[0])):
            return None
    return _FORWARD_RULE


def gradient_rule(op: Op, synced: Callable[[str], bool]) -> SplitRule | None:
    """The synchronised split of the gradient of a batch norm split so (``synced(name)``)."""
    if op.type not in GRADIENT or len(op.inputs) != 6 or \
            not op.attrs.get("is_training", True):
        return None
    fwd = op.inputs[3].op
    if not synced(fwd) or op.inputs[3] != TensorRef(fwd, 3) or \
            op.inputs[4] != TensorRef(fwd, 4):
        return None
    return _GRADIENT_RULE


def replica_copy(op: Op, name: str, k: int, origin: str | None = None) -> Op:
    """Replica k's own copy of ``op``, named ``name``: the same inputs and control inputs,
    no colocation, no share of the original's work (``origin``: what it stands for, ``op``
    unless said)."""
    return op.with_(name=name, colocate_with=(), meta=OpMeta(
        origin=origin or op.name, fraction=0.0, replica=k, folded=op.meta.folded))


class _Ops:
    """Collects the ops of one expansion; ``add`` returns the new op's output 0. An op of
    ``replica`` k is named ``{owner}/fastt_{suffix}{k}``; a shared one ``.../fastt_{suffix}``."""

    def __init__(self, owner: str, device: str) -> None:
        self.owner, self.device = owner, device
        self.ops: list[Op] = []

    def add(self, suffix: str, type_: str, inputs: list[TensorRef],
            shape: tuple[int | None, ...] | None, attrs: dict | None = None,
            dtype: str = "float32", replica: int | None = None, fraction: float = 0.0,
            name: str | None = None) -> TensorRef:
        meta = OpMeta(split_of=self.owner) if replica is None else \
            OpMeta(origin=self.owner, fraction=fraction, replica=replica)
        name = name or f"{self.owner}/fastt_{suffix}{'' if replica is None else replica}"
        self.ops.append(Op(name=name, type=type_, inputs=tuple(inputs),
                           outputs=(TensorSpec(dtype, shape),), device=self.device,
                           attrs={"T": dtype, **(attrs or {})}, meta=meta))
        return TensorRef(name, 0)

    def const(self, suffix: str, value: object, dtype: str, shape: tuple[int, ...],
              k: int) -> TensorRef:
        """Replica k's own constant (one on device 0 would cross a link per use)."""
        return self.add(suffix, "Const", [], shape, {"value": value, "dtype": dtype},
                        dtype=dtype, replica=k)

    def total(self, suffix: str, parts: list[TensorRef], shape: tuple[int | None, ...],
              k: int, dtype: str = "float32") -> TensorRef:
        """Replica k's sum of every replica's ``parts`` (the same op on each: equal bits)."""
        return self.add(suffix, "AddN", parts, shape, {"N": len(parts)}, dtype=dtype,
                        replica=k)

    def exchange(self, suffix: str, parts: list[list[TensorRef]], sizes: list[int],
                 ) -> list[list[TensorRef]]:
        """Each replica's sums of every replica's ``parts`` (replica k's vectors, ``sizes``
        elements each) in one exchange: each replica packs its vectors into one
        (``ConcatV2``), sums every replica's pack (``total``) and unpacks (``SplitV``). A
        message costs a link's latency whatever its size: two vectors sent apart queue one
        behind the other."""
        n, width = len(parts), sum(sizes)
        if len(sizes) == 1:
            return [[self.total(suffix, [p[0] for p in parts], (width,), k)] for k in range(n)]
        packs = [self.add(f"{suffix}_pack", "ConcatV2", parts[k], (width,),
                          {"axis": 0, "N": len(sizes)}, replica=k) for k in range(n)]
        out = []
        for k in range(n):
            whole = self.total(suffix, packs, (width,), k)
            name = f"{self.owner}/fastt_{suffix}_unpack{k}"
            self.ops.append(Op(name=name, type="SplitV", inputs=(whole,), device=self.device,
                               outputs=tuple(TensorSpec("float32", (m,)) for m in sizes),
                               attrs={"T": "float32", "axis": 0, "size_splits": list(sizes)},
                               meta=OpMeta(origin=self.owner, fraction=0.0, replica=k)))
            out.append([TensorRef(name, i) for i in range(len(sizes))])
        return out

    def copy(self, op: Op, suffix: str, k: int) -> TensorRef:
        """Replica k's copy of ``op`` (output 0), named ``{owner}/fastt_{suffix}{k}``."""
        name = f"{self.owner}/fastt_{suffix}{k}"
        self.ops.append(replica_copy(op, name, k, origin=self.owner))
        return TensorRef(name, 0)

    def to_float(self, suffix: str, size: TensorRef, shape: tuple[int, ...], k: int
                 ) -> TensorRef:
        """Replica k's ``float32`` of an ``int32`` count."""
        return self.add(suffix, "Cast", [size], shape, {"SrcT": "int32", "DstT": "float32",
                                                        "Truncate": False}, replica=k)

    def vector(self, suffix: str, v: TensorRef, c: int, nchw: bool, k: int) -> TensorRef:
        """A channel vector shaped to broadcast against the activations."""
        return self.add(f"{suffix}_bcast", "Reshape", [v], (c, 1, 1), {"shape": [c, 1, 1]},
                        replica=k) if nchw else v


def _rows(graph: Graph, ref: TensorRef, rows: list[int]) -> list[tuple[int | None, ...]]:
    """The shapes of tensor ``ref`` cut into ``rows`` rows each."""
    rest = tuple((graph.tensor(ref).shape or ())[1:])
    return [(r,) + rest for r in rows]


def expand_forward(op: Op, graph: Graph, x_parts: list[TensorRef],
                   rows: list[int]) -> tuple[list[Op], dict[TensorRef, TensorRef]]:
    """The ops replacing fused batch norm ``op`` (its rows ``x_parts``): the replicas'
    ``{op}/part{k}`` (output 0: their rows of y) and their statistics, each replica summing
    every replica's partial sums itself (one hop, where a shared sum would take two), and a
    join named like ``op`` (an ``IdentityN``: y's concat and replica 0's statistics). Also:
    op's outputs 1-5 -> the tensors that now hold them, for its readers."""
    c, axes = _channels(op, graph)  # type: ignore[misc]  # forward_rule checked it
    nchw = str(op.attrs.get("data_format", "NHWC")) == "NCHW"
    name, n = op.name, len(x_parts)
    b = _Ops(name, op.device)
    axes_ref = [b.const("axes", axes, "int32", (3,), k) for k in range(n)]
    eps = [b.const("eps", float(op.attrs.get("epsilon", 1e-3)), "float32", (), k)
           for k in range(n)]
    shapes = _rows(graph, op.inputs[0], rows)
    frac = [r / sum(rows) / 6 for r in rows]  # six ops a replica share the fused op's work
    sums = [b.add("sum", "Sum", [x_parts[k], axes_ref[k]], (c,), {"Tidx": "int32"}, replica=k,
                  fraction=frac[k]) for k in range(n)]
    scalar: tuple[int, ...]
    if name + SIZE in graph:  # each replica reads the whole batch's size from the batch
        size, scalar = graph[name + SIZE], ()
        totals = b.exchange("sum_all", [[s] for s in sums], [c])
        counted = [b.to_float("size_float", b.copy(size, "batch_size", k), scalar, k)
                   for k in range(n)]
    else:  # each replica's size travels with its sum (a pack's slice: shape [1])
        scalar = (1,)
        sizes = [b.add("size_vector", "Reshape", [b.to_float("size_float", b.add(
            "size", "Size", [x_parts[k]], (), {"T": "float32", "out_type": "int32"},
            dtype="int32", replica=k), (), k)], scalar, {"shape": [1]}, replica=k)
            for k in range(n)]
        totals = b.exchange("sum_all", [[sums[k], sizes[k]] for k in range(n)], [c, 1])
        counted = [t[1] for t in totals]
    count, mean, centred, squares = [], [], [], []
    for k in range(n):
        count.append(b.add("count", "RealDiv", [counted[k], b.const(
            "channels", float(c), "float32", (), k)], scalar, replica=k))
        mean.append(b.add("mean", "RealDiv", [totals[k][0], count[k]], (c,), replica=k))
        centred.append(b.add("centred", "Sub", [x_parts[k], b.vector("mean", mean[k], c, nchw,
                                                                    k)],
                             shapes[k], replica=k, fraction=frac[k]))
        squares.append(b.add("sq_sum", "Sum", [
            b.add("sq", "Square", [centred[k]], shapes[k], replica=k, fraction=frac[k]),
            axes_ref[k]], (c,), {"Tidx": "int32"}, replica=k, fraction=frac[k]))
    offset = op.inputs[2]
    var = []
    for k in range(n):
        var.append(b.add("var", "RealDiv", [b.total("sq_all", squares, (c,), k), count[k]],
                         (c,), replica=k))
        inv = b.add("inv", "Rsqrt", [b.add("var_eps", "AddV2", [var[k], eps[k]], (c,),
                                           replica=k)], (c,), replica=k)
        factor = b.vector("factor", b.add("factor", "Mul", [op.inputs[1], inv], (c,),
                                          replica=k), c, nchw, k)
        scaled = b.add("scaled", "Mul", [centred[k], factor], shapes[k], replica=k,
                       fraction=frac[k])
        b.add("", "AddV2", [scaled, b.vector("offset", offset, c, nchw, k)], shapes[k],
              replica=k, fraction=frac[k], name=f"{name}/part{k}")
    unbiased = b.add("var_unbiased", "Mul", [var[0], b.add("bessel", "RealDiv", [
        count[0], b.add("count_less_one", "Sub", [
            count[0], b.const("one", 1.0, "float32", (), 0)], scalar, replica=0)], scalar,
        replica=0)], (c,), replica=0)
    whole = graph.tensor(op.inputs[0]).shape
    concat = b.add("y", "ConcatV2", [TensorRef(f"{name}/part{k}", 0) for k in range(n)],
                   whole, {"axis": 0, "N": n})
    outs = [concat, mean[0], unbiased, mean[0], var[0], mean[0]]
    b.ops.append(_identity(name, op.device, outs, whole, c, 6, shapes))
    return b.ops, {TensorRef(name, i): outs[i] for i in range(1, 6)}


def expand_gradient(op: Op, graph: Graph, dy_parts: list[TensorRef],
                    rows: list[int]) -> tuple[list[Op], dict[TensorRef, TensorRef]]:
    """The ops replacing the gradient ``op`` of a batch norm expanded by ``expand_forward``
    (the replicas' ``{op}/part{k}``: their rows of dx, from the forward's centred rows and
    statistics), and its outputs 1-4 -> their new tensors (replica 0's)."""
    fwd = graph[graph[op.name].inputs[3].op]  # (op reads the renamed statistics)
    c, _ = _channels(fwd, graph)  # type: ignore[misc]
    nchw = str(fwd.attrs.get("data_format", "NHWC")) == "NCHW"
    name, n = op.name, len(dy_parts)
    b = _Ops(name, op.device)

    def stat(s: str, k: int | str = "") -> TensorRef:
        return TensorRef(f"{fwd.name}/fastt_{s}{k}", 0)

    shapes = _rows(graph, op.inputs[0], rows)
    frac = [r / sum(rows) / 7 for r in rows]  # seven ops a replica
    dy_sums = [b.add("dy_sum", "Sum", [dy_parts[k], stat("axes", k)], (c,), {"Tidx": "int32"},
                     replica=k, fraction=frac[k]) for k in range(n)]
    dots = [b.add("dot", "Sum", [
        b.add("dy_c", "Mul", [dy_parts[k], stat("centred", k)], shapes[k], replica=k,
              fraction=frac[k]), stat("axes", k)], (c,), {"Tidx": "int32"}, replica=k,
        fraction=frac[k]) for k in range(n)]
    totals = b.exchange("d_offset", [[dy_sums[k], dots[k]] for k in range(n)], [c, c])
    d_scale, d_offset = [], []
    for k in range(n):
        d_offset.append(totals[k][0])
        dot = totals[k][1]
        d_scale.append(b.add("d_scale", "Mul", [dot, stat("inv", k)], (c,), replica=k))
        mean_dy = b.vector("mean_dy", b.add("mean_dy", "RealDiv", [
            d_offset[k], stat("count", k)], (c,), replica=k), c, nchw, k)
        coef = b.vector("coef", b.add("coef", "Mul", [
            b.add("mean_dot", "RealDiv", [dot, stat("count", k)], (c,), replica=k),
            b.add("inv_sq", "Square", [stat("inv", k)], (c,), replica=k)], (c,), replica=k),
            c, nchw, k)
        rest = b.add("dy_centred", "Sub", [dy_parts[k], mean_dy], shapes[k], replica=k,
                     fraction=frac[k])
        proj = b.add("proj", "Mul", [stat("centred", k), coef], shapes[k], replica=k,
                     fraction=frac[k])
        diff = b.add("diff", "Sub", [rest, proj], shapes[k], replica=k, fraction=frac[k])
        factor = stat("factor_bcast" if nchw else "factor", k)
        b.add("", "Mul", [diff, factor], shapes[k], replica=k, fraction=frac[k],
              name=f"{name}/part{k}")
    whole = graph.tensor(op.inputs[0]).shape
    concat = b.add("dx", "ConcatV2", [TensorRef(f"{name}/part{k}", 0) for k in range(n)],
                   whole, {"axis": 0, "N": n})
    outs = [concat, d_scale[0], d_offset[0], d_offset[0], d_offset[0]]
    b.ops.append(_identity(name, op.device, outs, whole, c, 5, shapes))
    return b.ops, {TensorRef(name, i): outs[i] for i in range(1, 5)}


def _identity(name: str, device: str, outs: list[TensorRef], whole: tuple | None, c: int,
              count: int, shapes: list[tuple[int | None, ...]]) -> Op:
    """The join named like the replaced op: its outputs (y or dx whole, then channel
    vectors), for whoever still reads or fetches it."""
    join = {"kind": "concat", "axis": 0, "sizes": [s[0] for s in shapes],
            "total": sum(s[0] or 0 for s in shapes)}
    return Op(name=name, type="IdentityN", inputs=tuple(outs), device=device,
              outputs=tuple(TensorSpec("float32", whole if i == 0 else (c,))
                            for i in range(count)),
              meta=OpMeta(split_of=name, join=join))
