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

    forward, replica k:  s_k = sum(x_k);  c_k = x_k - mean;  q_k = sum(c_k^2);  y_k = c_k*f + offset
    shared:              n = sum(size(x_k)) / C;  mean = sum(s)/n;  var = sum(q)/n;
                         inv = rsqrt(var + eps);  f = scale * inv
    gradient, replica k: a_k = sum(dy_k);  b_k = sum(dy_k * c_k);
                         dx_k = (dy_k - sum(a)/n - c_k * (sum(b)/n) * inv^2) * f
    shared:              d_scale = sum(b) * inv;  d_offset = sum(a)

Each replica's ops share the fused op's work (``meta.fraction``); the shared ops are the
split's own (``meta.split_of``), like the cuts and joins of any split.
"""
from __future__ import annotations

from fastt.ir import Graph, Op, OpMeta, TensorRef, TensorSpec
from fastt.sched.split_rules import FULL, SPLIT, Part, SplitRule

FORWARD = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})
GRADIENT = frozenset({"FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"})
SYNC = "sync"  # the SplitRule dimension of a synchronised batch norm
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


def gradient_rule(op: Op, synced: set[str]) -> SplitRule | None:
    """The synchronised split of the gradient of a batch norm split so (``synced``)."""
    if op.type not in GRADIENT or len(op.inputs) != 6 or \
            not op.attrs.get("is_training", True):
        return None
    fwd = op.inputs[3].op
    if fwd not in synced or op.inputs[3] != TensorRef(fwd, 3) or \
            op.inputs[4] != TensorRef(fwd, 4):
        return None
    return _GRADIENT_RULE


class _Ops:
    """Collects the ops of one expansion; ``add`` returns the new op's output 0."""

    def __init__(self, owner: str, dtype: str, device: str) -> None:
        self.owner, self.dtype, self.device = owner, dtype, device
        self.ops: list[Op] = []

    def add(self, suffix: str, type_: str, inputs: list[TensorRef],
            shape: tuple[int | None, ...] | None, attrs: dict | None = None,
            dtype: str | None = None, replica: int | None = None,
            fraction: float = 1.0, name: str | None = None) -> TensorRef:
        dt = dtype or self.dtype
        meta = OpMeta(split_of=self.owner) if replica is None else \
            OpMeta(origin=self.owner, fraction=fraction, replica=replica)
        op = Op(name=name or f"{self.owner}/fastt_{suffix}", type=type_, inputs=tuple(inputs),
                outputs=(TensorSpec(dt, shape),), device=self.device,
                attrs={"T": dt, **(attrs or {})}, meta=meta)
        self.ops.append(op)
        return TensorRef(op.name, 0)

    def const(self, suffix: str, value: object, dtype: str,
              shape: tuple[int, ...]) -> TensorRef:
        return self.add(suffix, "Const", [], shape, {"value": value, "dtype": dtype},
                        dtype=dtype)

    def total(self, suffix: str, parts: list[TensorRef], shape: tuple[int | None, ...],
              dtype: str | None = None) -> TensorRef:
        return self.add(suffix, "AddN", parts, shape, {"N": len(parts)}, dtype=dtype)


def _vector(b: _Ops, suffix: str, v: TensorRef, c: int, nchw: bool) -> TensorRef:
    """A channel vector shaped to broadcast against the activations."""
    return b.add(f"{suffix}_bcast", "Reshape", [v], (c, 1, 1), {"shape": [c, 1, 1]}) \
        if nchw else v


def expand_forward(op: Op, graph: Graph, x_parts: list[TensorRef],
                   shares: list[int]) -> tuple[list[Op], dict[TensorRef, TensorRef]]:
    """The ops replacing fused batch norm ``op`` (its rows ``x_parts``): the replicas'
    ``{op}/part{k}`` (output 0: their rows of y), the shared statistics, and a join named
    like ``op`` (an ``IdentityN``: y's concat and the statistics). Also: op's outputs 1-5 ->
    the tensors that now hold them, for its readers."""
    c, axes = _channels(op, graph)  # type: ignore[misc]  # forward_rule checked it
    nchw = str(op.attrs.get("data_format", "NHWC")) == "NCHW"
    name, n, total = op.name, len(x_parts), sum(shares)
    b = _Ops(name, "float32", op.device)
    axes_ref = b.const("axes", axes, "int32", (3,))
    whole = graph.tensor(op.inputs[0]).shape or ()
    rows = [(whole[0] or 0) * s // total for s in shares]
    x_shapes = [(r,) + tuple(whole[1:]) for r in rows]
    frac = [s / total / 6 for s in shares]  # six ops a replica share the fused op's work
    sums = [b.add(f"sum{k}", "Sum", [x_parts[k], axes_ref], (c,), {"Tidx": "int32"},
                  replica=k, fraction=frac[k]) for k in range(n)]
    sizes = [b.add(f"size{k}", "Size", [x_parts[k]], (), {"T": "float32", "out_type": "int32"},
                   dtype="int32", replica=k, fraction=0.0) for k in range(n)]
    count = b.add("count", "RealDiv", [
        b.add("count_all", "Cast", [b.total("size", sizes, (), dtype="int32")], (),
              {"SrcT": "int32", "DstT": "float32", "Truncate": False}),
        b.const("channels", float(c), "float32", ())], ())
    mean = b.add("mean", "RealDiv", [b.total("sum", sums, (c,)), count], (c,))
    mean_b = _vector(b, "mean", mean, c, nchw)
    centred = [b.add(f"centred{k}", "Sub", [x_parts[k], mean_b], x_shapes[k], replica=k,
                     fraction=frac[k]) for k in range(n)]
    squares = [b.add(f"sq_sum{k}", "Sum", [
        b.add(f"sq{k}", "Square", [centred[k]], x_shapes[k], replica=k, fraction=frac[k]),
        axes_ref], (c,), {"Tidx": "int32"}, replica=k, fraction=frac[k]) for k in range(n)]
    var = b.add("var", "RealDiv", [b.total("sq_sum", squares, (c,)), count], (c,))
    one = b.const("one", 1.0, "float32", ())
    unbiased = b.add("var_unbiased", "Mul", [var, b.add("bessel", "RealDiv", [
        count, b.add("count_less_one", "Sub", [count, one], ())], ())], (c,))
    inv = b.add("inv", "Rsqrt", [b.add("var_eps", "AddV2", [
        var, b.const("eps", float(op.attrs.get("epsilon", 1e-3)), "float32", ())], (c,))],
        (c,))
    factor = _vector(b, "factor", b.add("factor", "Mul", [op.inputs[1], inv], (c,)), c, nchw)
    offset = _vector(b, "offset", op.inputs[2], c, nchw)
    ys = [b.add("", "AddV2", [b.add(f"scaled{k}", "Mul", [centred[k], factor], x_shapes[k],
                                    replica=k, fraction=frac[k]), offset],
                x_shapes[k], replica=k, fraction=frac[k], name=f"{name}/part{k}")
          for k in range(n)]
    concat = b.add("y", "ConcatV2", ys, whole, {"axis": 0, "N": n})
    outs = [concat, mean, unbiased, mean, var, mean]
    b.ops.append(Op(name=name, type="IdentityN", inputs=tuple(outs), device=op.device,
                    outputs=tuple(TensorSpec("float32", whole if i == 0 else (c,))
                                  for i in range(6)),
                    meta=OpMeta(split_of=name, join=_join(rows, total))))
    return b.ops, {TensorRef(name, i): outs[i] for i in range(1, 6)}


def expand_gradient(op: Op, graph: Graph, dy_parts: list[TensorRef],
                    shares: list[int]) -> tuple[list[Op], dict[TensorRef, TensorRef]]:
    """The ops replacing the gradient ``op`` of a batch norm expanded by ``expand_forward``
    (the replicas' ``{op}/part{k}``: their rows of dx), and its outputs 1-4 -> their new
    tensors."""
    fwd = graph[graph[op.name].inputs[3].op]  # (op reads the renamed statistics)
    c, axes = _channels(fwd, graph)  # type: ignore[misc]
    nchw = str(fwd.attrs.get("data_format", "NHWC")) == "NCHW"
    name, n, total = op.name, len(dy_parts), sum(shares)
    b = _Ops(name, "float32", op.device)
    stat = {s: TensorRef(f"{fwd.name}/fastt_{s}", 0)
            for s in ("axes", "count", "inv", "factor", "factor_bcast")}
    factor = stat["factor_bcast" if nchw else "factor"]
    whole = graph.tensor(op.inputs[0]).shape or ()
    rows = [(whole[0] or 0) * s // total for s in shares]
    shapes = [(r,) + tuple(whole[1:]) for r in rows]
    frac = [s / total / 7 for s in shares]  # seven ops a replica
    centred = [TensorRef(f"{fwd.name}/fastt_centred{k}", 0) for k in range(n)]
    dy_sums = [b.add(f"dy_sum{k}", "Sum", [dy_parts[k], stat["axes"]], (c,), {"Tidx": "int32"},
                     replica=k, fraction=frac[k]) for k in range(n)]
    dot = [b.add(f"dot{k}", "Sum", [
        b.add(f"dy_c{k}", "Mul", [dy_parts[k], centred[k]], shapes[k], replica=k,
              fraction=frac[k]), stat["axes"]], (c,), {"Tidx": "int32"}, replica=k,
        fraction=frac[k]) for k in range(n)]
    d_offset = b.total("d_offset", dy_sums, (c,))
    dots = b.total("dot", dot, (c,))
    d_scale = b.add("d_scale", "Mul", [dots, stat["inv"]], (c,))
    mean_dy = _vector(b, "mean_dy", b.add("mean_dy", "RealDiv", [d_offset, stat["count"]],
                                          (c,)), c, nchw)
    coef = _vector(b, "coef", b.add("coef", "Mul", [
        b.add("mean_dot", "RealDiv", [dots, stat["count"]], (c,)),
        b.add("inv_sq", "Square", [stat["inv"]], (c,))], (c,)), c, nchw)
    dxs = []
    for k in range(n):
        rest = b.add(f"dy_centred{k}", "Sub", [dy_parts[k], mean_dy], shapes[k], replica=k,
                     fraction=frac[k])
        proj = b.add(f"proj{k}", "Mul", [centred[k], coef], shapes[k], replica=k,
                     fraction=frac[k])
        diff = b.add(f"diff{k}", "Sub", [rest, proj], shapes[k], replica=k, fraction=frac[k])
        dxs.append(b.add("", "Mul", [diff, factor], shapes[k], replica=k, fraction=frac[k],
                         name=f"{name}/part{k}"))
    concat = b.add("dx", "ConcatV2", dxs, whole, {"axis": 0, "N": n})
    outs = [concat, d_scale, d_offset, d_offset, d_offset]
    b.ops.append(Op(name=name, type="IdentityN", inputs=tuple(outs), device=op.device,
                    outputs=tuple(TensorSpec("float32", whole if i == 0 else (c,))
                                  for i in range(5)),
                    meta=OpMeta(split_of=name, join=_join(rows, total))))
    return b.ops, {TensorRef(name, i): outs[i] for i in range(1, 5)}


def _join(rows: list[int], total: int) -> dict:
    return {"kind": "concat", "axis": 0, "sizes": rows, "total": total}
