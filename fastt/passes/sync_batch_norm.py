"""Batch normalisation split on the batch with the whole batch's statistics (synchronised
BatchNorm), for data parallelism.

In training, a fused batch norm normalises each channel with the mean and biased variance of
the whole batch, and its gradient needs two sums over the whole batch. Cut on the batch, each
replica computes its rows' moments (their sum s_k, count n_k and sum of squares about their own
mean q_k, two passes as TensorFlow's CPU kernel does); every replica's moments give the
batch's (Chan, Golub and LeVeque's pairwise combination, as stable as the two passes), so
results agree up to rounding. Each replica normalises its rows, and computes its rows of the
gradient, with them. What crosses devices is a few channel vectors per replica, not the
activations::

    forward, replica k:  m_k = s_k / n_k;  d_k = x_k - m_k;  q_k = sum(d_k^2);
                         n = sum(n);  mean = sum(s) / n;
                         var = (sum(q) + sum((s_i - n_i mean)^2 / n_i)) / n;
                         f = scale * rsqrt(var + eps);  t_k = m_k - mean;
                         y_k = d_k * f + (offset + t_k * f)
    gradient, replica k: a_k = sum(dy_k);  b_k = sum(dy_k * d_k) + t_k * a_k;
                         g = (sum(b)/n) * rsqrt(var + eps)^2;
                         dx_k = (dy_k - (sum(a)/n + t_k * g) - d_k * g) * f
                         d_scale = sum(b) * rsqrt(var + eps);  d_offset = sum(a)

(x_k - mean is d_k + t_k: the whole batch's mean enters through channel vectors only, so a
replica makes as many passes over its rows as before, and the moments need one exchange.)
Every replica combines every replica's vectors itself (the same ops, so the same bits): a
statistic takes one hop between devices, where a sum on one device would take two. The
vectors a replica sends at once travel packed in one message ((s_k, n_k, q_k); (a_k, b_k)):
two exchanges a batch norm, forward and gradient.
Each replica's ops on its rows share the fused op's work (``meta.fraction``).
"""
from __future__ import annotations

from typing import Callable

from fastt.ir import Graph, Op, OpMeta, TensorRef, TensorSpec, tensor_spec
from fastt.passes.split_rules import FULL, SPLIT, Part, SplitRule

FORWARD = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})
GRADIENT = frozenset({"FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"})
SYNC = "sync"  # the SplitRule dimension of a synchronised batch norm
#: a gradient's x: the forward's centred parts c_k are reused instead
_FORWARD_RULE = SplitRule(SYNC, (Part(SPLIT, 0),) + (Part(FULL),) * 4, "concat", 0)
_GRADIENT_RULE = SplitRule(SYNC, (Part(SPLIT, 0),) + (Part(FULL),) * 5, "concat", 0)


def training(op: Op) -> bool:
    """Whether a batch norm (or its gradient) normalises with the batch's own statistics
    (TensorFlow's default)."""
    return bool(op.attrs.get("is_training", True))


def _channels(op: Op, graph: Graph) -> tuple[int, list[int]] | None:
    """(C, the axes reduced) of a 4-D float32 batch norm in training, or None."""
    shape = graph.tensor(op.inputs[0]).shape if op.inputs else None
    fmt = str(op.attrs.get("data_format", "NHWC"))
    if not training(op) or shape is None or len(shape) != 4 or \
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
    if op.type not in GRADIENT or len(op.inputs) != 6 or not training(op):
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
                           outputs=(tensor_spec(dtype, shape),), device=self.device,
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
    ``{op}/part{k}`` (output 0: their rows of y) and their statistics, each replica combining
    every replica's moments itself (one exchange), and a join named like ``op`` (an
    ``IdentityN``: y's concat and replica 0's statistics). Also: op's outputs 1-5 -> the
    tensors that now hold them, for its readers."""
    c, axes = _channels(op, graph)  # type: ignore[misc]  # forward_rule checked it
    nchw = str(op.attrs.get("data_format", "NHWC")) == "NCHW"
    name, n = op.name, len(x_parts)
    b = _Ops(name, op.device)
    axes_ref = [b.const("axes", axes, "int32", (3,), k) for k in range(n)]
    shapes = _rows(graph, op.inputs[0], rows)
    frac = [r / sum(rows) / 6 for r in rows]  # six ops a replica share the fused op's work
    packs, local_mean, centred = [], [], []
    for k in range(n):  # replica k's moments of its rows: (sum, count, sum of squares)
        s = b.add("sum", "Sum", [x_parts[k], axes_ref[k]], (c,), {"Tidx": "int32"},
                  replica=k, fraction=frac[k])
        size = b.to_float("size_float", b.add("size", "Size", [x_parts[k]], (), {
            "T": "float32", "out_type": "int32"}, dtype="int32", replica=k), (), k)
        rows_k = b.add("rows", "RealDiv", [b.add("size_vector", "Reshape", [size], (1,), {
            "shape": [1]}, replica=k), b.const("channels", float(c), "float32", (), k)], (1,),
            replica=k)
        local_mean.append(b.add("local_mean", "RealDiv", [s, rows_k], (c,), replica=k))
        centred.append(b.add("centred", "Sub", [
            x_parts[k], b.vector("local_mean", local_mean[k], c, nchw, k)], shapes[k],
            replica=k, fraction=frac[k]))
        squares = b.add("sq_sum", "Sum", [
            b.add("sq", "Square", [centred[k]], shapes[k], replica=k, fraction=frac[k]),
            axes_ref[k]], (c,), {"Tidx": "int32"}, replica=k, fraction=frac[k])
        packs.append(b.add("moments_pack", "ConcatV2", [s, rows_k, squares], (2 * c + 1,),
                           {"axis": 0, "N": 3}, replica=k))
    offset = op.inputs[2]
    count, mean, var = [], [], []
    for k in range(n):
        mean_k, var_k, count_k = _combine(b, packs, c, k)
        count.append(count_k)
        mean.append(mean_k)
        var.append(var_k)
        inv = b.add("inv", "Rsqrt", [b.add("var_eps", "AddV2", [var_k, b.const(
            "eps", float(op.attrs.get("epsilon", 1e-3)), "float32", (), k)], (c,),
            replica=k)], (c,), replica=k)
        factor = b.add("factor", "Mul", [op.inputs[1], inv], (c,), replica=k)
        # y = (x - mean) f + offset = (x - local mean) f + (offset + (local mean - mean) f)
        shift = b.add("shift", "Sub", [local_mean[k], mean_k], (c,), replica=k)
        moved = b.add("offset_shifted", "AddV2", [offset, b.add(
            "shift_scaled", "Mul", [shift, factor], (c,), replica=k)], (c,), replica=k)
        scaled = b.add("scaled", "Mul", [centred[k], b.vector("factor", factor, c, nchw, k)],
                       shapes[k], replica=k, fraction=frac[k])
        b.add("", "AddV2", [scaled, b.vector("offset", moved, c, nchw, k)], shapes[k],
              replica=k, fraction=frac[k], name=f"{name}/part{k}")
    unbiased = b.add("var_unbiased", "Mul", [var[0], b.add("bessel", "RealDiv", [
        count[0], b.add("count_less_one", "Sub", [
            count[0], b.const("one", 1.0, "float32", (), 0)], (1,), replica=0)], (1,),
        replica=0)], (c,), replica=0)
    whole = graph.tensor(op.inputs[0]).shape
    concat = b.add("y", "ConcatV2", [TensorRef(f"{name}/part{k}", 0) for k in range(n)],
                   whole, {"axis": 0, "N": n})
    outs = [concat, mean[0], unbiased, mean[0], var[0], mean[0]]
    b.ops.append(_identity(name, op.device, outs, whole, c, 6, shapes))
    return b.ops, {TensorRef(name, i): outs[i] for i in range(1, 6)}


def _combine(b: _Ops, packs: list[TensorRef], c: int, k: int
             ) -> tuple[TensorRef, TensorRef, TensorRef]:
    """Replica k's (mean, biased variance, count) of the whole batch from every replica's
    pack (sum s_i, count n_i, sum of squares about its own mean q_i; Chan, Golub and LeVeque
    1979): mean = sum(s) / n, variance = (sum(q) + sum((s_i - n_i mean)^2 / n_i)) / n. The
    same ops on every replica (equal bits)."""
    n = len(packs)
    table = b.add("moments", "Pack", packs, (n, 2 * c + 1), {"axis": 0, "N": n}, replica=k)
    name = f"{b.owner}/fastt_moments_unpack{k}"
    b.ops.append(Op(name=name, type="SplitV", inputs=(table,), device=b.device,
                    outputs=(TensorSpec("float32", (n, c)), TensorSpec("float32", (n, 1)),
                             TensorSpec("float32", (n, c))),
                    attrs={"T": "float32", "axis": 1, "size_splits": [c, 1, c]},
                    meta=OpMeta(origin=b.owner, fraction=0.0, replica=k)))
    sums, counts, squares = (TensorRef(name, i) for i in range(3))
    zero = b.const("zero_axis", 0, "int32", (), k)

    def total(suffix: str, ref: TensorRef, width: int) -> TensorRef:
        return b.add(suffix, "Sum", [ref, zero], (width,), {"Tidx": "int32"}, replica=k)

    count = total("count", counts, 1)
    mean = b.add("mean", "RealDiv", [total("sum_all", sums, c), count], (c,), replica=k)
    apart = b.add("apart", "Sub", [sums, b.add("expected", "Mul", [counts, mean], (n, c),
                                               replica=k)], (n, c), replica=k)
    between = total("between", b.add("between_parts", "RealDiv", [
        b.add("apart_sq", "Square", [apart], (n, c), replica=k), counts], (n, c), replica=k), c)
    var = b.add("var", "RealDiv", [b.add("spread", "AddV2", [
        total("sq_all", squares, c), between], (c,), replica=k), count], (c,), replica=k)
    return mean, var, count


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
    # sum(dy (x - mean)) = sum(dy (x - local mean)) + (local mean - mean) sum(dy)
    dots = [b.add("dot", "AddV2", [b.add("dot_local", "Sum", [
        b.add("dy_c", "Mul", [dy_parts[k], stat("centred", k)], shapes[k], replica=k,
              fraction=frac[k]), stat("axes", k)], (c,), {"Tidx": "int32"}, replica=k,
        fraction=frac[k]), b.add("dot_shift", "Mul", [stat("shift", k), dy_sums[k]], (c,),
                                 replica=k)], (c,), replica=k) for k in range(n)]
    totals = b.exchange("d_offset", [[dy_sums[k], dots[k]] for k in range(n)], [c, c])
    d_scale, d_offset = [], []
    for k in range(n):
        d_offset.append(totals[k][0])
        dot = totals[k][1]
        d_scale.append(b.add("d_scale", "Mul", [dot, stat("inv", k)], (c,), replica=k))
        coef = b.add("coef", "Mul", [
            b.add("mean_dot", "RealDiv", [dot, stat("count", k)], (c,), replica=k),
            b.add("inv_sq", "Square", [stat("inv", k)], (c,), replica=k)], (c,), replica=k)
        # dy - mean(dy) - (x - mean) coef = dy - (mean(dy) + shift coef) - (x - local mean) coef
        mean_dy = b.vector("mean_dy", b.add("mean_dy", "AddV2", [b.add(
            "mean_dy_local", "RealDiv", [d_offset[k], stat("count", k)], (c,), replica=k),
            b.add("coef_shift", "Mul", [stat("shift", k), coef], (c,), replica=k)], (c,),
            replica=k), c, nchw, k)
        rest = b.add("dy_centred", "Sub", [dy_parts[k], mean_dy], shapes[k], replica=k,
                     fraction=frac[k])
        proj = b.add("proj", "Mul", [stat("centred", k), b.vector("coef", coef, c, nchw, k)],
                     shapes[k], replica=k, fraction=frac[k])
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
