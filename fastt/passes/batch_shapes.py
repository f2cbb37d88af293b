"""Batch dimensions TensorFlow's shape inference leaves unknown, filled before a step runs
(no TensorFlow here): a functional ``If`` (tf-keras' batch norm in graph mode) has its output
shapes recorded when the graph was built, with the batch unknown, so that nothing after it
has a known size until a run measures one. O(ops + edges)."""
from __future__ import annotations

import math

from fastt.ir import Graph, TensorRef

RESHAPES = frozenset({"Reshape"})


def batch_filled(graph: Graph, batch: int) -> dict[TensorRef, tuple[int, ...]]:
    """Each output whose leading dimension is unknown and the rest known, of an op that reads
    a tensor whose leading dimension is ``batch`` (the rest known): the shape with the batch
    leading (a ``Reshape`` keeps its input's element count instead). An over-estimate where
    such an op's leading dimension is not the batch, which a profile then replaces."""
    filled: dict[TensorRef, tuple[int, ...]] = {}

    def shape(ref: TensorRef) -> tuple[int | None, ...] | None:
        return filled.get(ref) or graph.tensor(ref).shape

    for name in graph.topological_order():
        op = graph[name]
        ins = [shape(r) for r in op.inputs]
        batched = [s for s in ins if s and s[0] == batch and None not in s]
        if not batched:
            continue
        for i, t in enumerate(op.outputs):
            s = t.shape
            if not s or s[0] is not None or None in s[1:]:
                continue
            rest = tuple(d for d in s[1:] if d is not None)
            if op.type in RESHAPES:
                size, per = math.prod(d for d in batched[0] if d is not None), math.prod(rest)
                if not per or size % per:
                    continue
                filled[TensorRef(name, i)] = (size // per, *rest)
            else:
                filled[TensorRef(name, i)] = (batch, *rest)
    return filled
