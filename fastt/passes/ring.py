"""The ring all-reduce of summed gradients, built from ordinary ops: fused buckets cut in
one chunk per replica, each chunk summed along the ring (reduce-scatter) then passed along it
to every replica (all-gather), so each link carries 2(n-1)/n of a bucket's bytes (Patarasuk
and Yuan, JPDC 2009; Horovod's tensor fusion). ``fastt.passes.allreduce`` decides what is
reduced; this module only builds the ops. O(n^2) ops per bucket. With ``collective`` (GPUs
of one process), each bucket is summed instead by one ``NcclAllReduce`` per replica: NCCL
runs the same ring on a stream of its own, so a ring step never waits for a kernel of the
backward pass (``Problem.stream``); each replica's op waits for every replica's fused bucket,
as NCCL's launch does.
"""
from __future__ import annotations

import math
from typing import Any

from fastt.ir import Graph, Op, OpMeta, TensorRef, TensorSpec
from fastt.op_types import COLLECTIVE_TYPES
from fastt.passes.replicas import replica_of
from fastt.passes.split_rules import part_sizes

SCOPE = "fastt_allreduce"


MIRROR = "/mirror"


def mirror_name(name: str, k: int) -> str:
    """Replica k's copy of op ``name`` (replica 0's is the op itself)."""
    return name if k == 0 else f"{name}{MIRROR}{k}"


COLLECTIVE = "NcclAllReduce"
assert COLLECTIVE in COLLECTIVE_TYPES


def ring_ops(g: Graph, sums: set[str], replicated: set[str], n: int, bucket_bytes: float,
             gates: set[str], collective: bool = False) -> list[Op]:
    """The ops of the ring all-reduce of the sums ``sums`` (``AddN`` joins of ``n``
    replicas' parts) in ``g``. A bucket never holds a sum that another of its sums needs
    (BatchNorm's backward goes on from the sum of its gradient over the batch): the bucket
    is closed before it. ``replicated``: the replicas' ops, which drop their control inputs
    ``gates``; ``collective``: NCCL's all-reduce instead of ordinary ops."""
    order = g.topological_order()
    joins = sorted(sums, key={name: i for i, name in enumerate(order)}.__getitem__)
    bit = {j: 1 << i for i, j in enumerate(joins)}
    needs: dict[str, int] = {}  # op -> the sums it needs (bit set), itself included
    for name in order:
        op = g[name]
        control = op.control_inputs if name not in replicated else \
            [c for c in op.control_inputs if c not in gates]
        mask = bit.get(name, 0)
        for p in [r.op for r in op.inputs] + list(control):
            mask |= needs[p]
        needs[name] = mask
    buckets: list[list[str]] = []
    filling: dict[str, tuple[list[str], list[int]]] = {}  # dtype -> (bucket, [bytes, sums])
    for j in joins:
        spec = g[j].outputs[0]
        if spec.dims is None or spec.nbytes is None:
            continue  # unknown size: summed as before (the join stays)
        if spec.dtype in filling and needs[j] & ~bit[j] & filling[spec.dtype][1][1]:
            del filling[spec.dtype]
        if spec.dtype not in filling:
            filling[spec.dtype] = ([], [0, 0])
            buckets.append(filling[spec.dtype][0])
        bucket, used = filling[spec.dtype]
        bucket.append(j)
        used[0] += spec.nbytes
        used[1] |= bit[j]
        if used[0] >= bucket_bytes:
            del filling[spec.dtype]
    out: list[Op] = []
    for i, b in enumerate(buckets):
        out += _bucket(g, f"{SCOPE}/bucket{i}", b, n, collective)
    return out


def _made(name: str, type_: str, inputs: list[TensorRef], spec: TensorSpec, k: int,
          scope: str, **attrs: object) -> Op:
    return Op(name=name, type=type_, inputs=tuple(inputs), outputs=(spec,), attrs=dict(attrs),
              meta=OpMeta(split_of=scope, replica=k))


def _bucket(g: Graph, scope: str, joins: list[str], n: int, collective: bool) -> list[Op]:
    """Fuse, reduce-scatter, all-gather (or NCCL's all-reduce) and unfuse the sums ``joins``
    over ``n`` replicas."""
    dtype = g[joins[0]].outputs[0].dtype
    numel = [math.prod(g[j].outputs[0].dims or ()) for j in joins]
    total = sum(numel)
    chunks = part_sizes(total, n)
    ops: list[Op] = []

    def vec(m: int) -> TensorSpec:
        return TensorSpec(dtype, (m,))

    pieces: list[list[TensorRef]] = []  # replica -> its chunks
    bufs: list[TensorRef] = []  # replica -> its fused bucket
    for k in range(n):
        flats = []
        for j, m in zip(joins, numel):
            part = g[j].inputs[_input_of(g, j, k)]
            if len(g.tensor(part).dims or ()) == 1:
                flats.append(part)
                continue
            flat = f"{scope}/flat/{j.replace('/', '_')}/part{k}"
            ops.append(_made(flat, "Reshape", [part], vec(m), k, scope, shape=[-1]))
            flats.append(TensorRef(ops[-1].name, 0))
        buf = flats[0]
        if len(flats) > 1:
            ops.append(_made(f"{scope}/fused/part{k}", "ConcatV2", flats, vec(total), k, scope,
                             axis=0))
            buf = TensorRef(ops[-1].name, 0)
        bufs.append(buf)
        if collective:
            continue
        ops.append(Op(name=f"{scope}/chunks/part{k}", type="SplitV", inputs=(buf,),
                      outputs=tuple(vec(c) for c in chunks),
                      attrs={"axis": 0, "size_splits": chunks},
                      meta=OpMeta(split_of=scope, replica=k)))
        pieces.append([TensorRef(ops[-1].name, c) for c in range(n)])
    if collective:
        summed = _collective(scope, bufs, vec(total))
        ops += summed
        fulls = [TensorRef(op.name, 0) for op in summed]
    else:
        fulls = _ring(scope, pieces, chunks, vec, total, ops)
    for k in range(n):
        full = fulls[k]
        outs = [full]
        if len(joins) > 1:
            ops.append(Op(name=f"{scope}/unfused/part{k}", type="SplitV", inputs=(full,),
                          outputs=tuple(vec(m) for m in numel),
                          attrs={"axis": 0, "size_splits": numel},
                          meta=OpMeta(split_of=scope, replica=k)))
            outs = [TensorRef(ops[-1].name, i) for i in range(len(joins))]
        for j, ref in zip(joins, outs):
            spec = g[j].outputs[0]
            ops.append(_made(mirror_name(j, k), "Reshape", [ref], spec, k, scope,
                             shape=list(spec.dims or ())))
    return ops


def _ring(scope: str, pieces: list[list[TensorRef]], chunks: list[int], vec: Any,
          total: int, ops: list[Op]) -> list[TensorRef]:
    """Reduce-scatter then all-gather of the replicas' chunks ``pieces`` (appended to
    ``ops``): each replica's summed bucket."""
    n = len(pieces)
    gathered: list[list[TensorRef]] = [[] for _ in range(n)]  # replica -> reduced chunks
    for c in range(n):
        acc = pieces[(c + 1) % n][c]
        for h in range(1, n):  # reduce-scatter: chunk c ends summed on replica c
            r = (c + 1 + h) % n
            ops.append(_made(f"{scope}/reduce{c}/part{r}", "AddN", [acc, pieces[r][c]],
                             vec(chunks[c]), r, scope))
            acc = TensorRef(ops[-1].name, 0)
        gathered[c] = [acc] * n
        for h in range(1, n):  # all-gather: passed on along the ring
            r = (c + h) % n
            ops.append(_made(f"{scope}/gather{c}/part{r}", "Identity", [acc], vec(chunks[c]),
                             r, scope))
            acc = TensorRef(ops[-1].name, 0)
            gathered[c][r] = acc
    fulls = []
    for k in range(n):
        parts = [gathered[c][k] for c in range(n)]
        ops.append(_made(f"{scope}/summed/part{k}", "ConcatV2", parts, vec(total), k, scope,
                         axis=0))
        fulls.append(TensorRef(ops[-1].name, 0))
    return fulls


def _collective(scope: str, bufs: list[TensorRef], spec: TensorSpec) -> list[Op]:
    """One ``NcclAllReduce`` (sum) per replica of the fused buckets ``bufs``; each waits for
    every replica's bucket."""
    n = len(bufs)
    return [Op(name=f"{scope}/summed/part{k}", type=COLLECTIVE, inputs=(bufs[k],),
               control_inputs=tuple(dict.fromkeys(b.op for j, b in enumerate(bufs) if j != k)),
               outputs=(spec,), attrs={"reduction": "sum", "num_devices": n,
                                       "shared_name": scope, "T": spec.dtype},
               meta=OpMeta(split_of=scope, replica=k)) for k in range(n)]


def _input_of(g: Graph, join: str, k: int) -> int:
    """The input of ``join`` that replica k computed."""
    for i, r in enumerate(g[join].inputs):
        if replica_of(g[r.op]) == k:
            return i
    return k
