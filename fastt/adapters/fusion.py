"""Which ops TensorFlow may run as one fused kernel (no TensorFlow import here).

Grappler's remapper and oneDNN fuse a contraction (Conv2D, MatMul, their gradients...) with
the element-wise ops right after it (BiasAdd, an activation, an Add), a weight gradient with
the BiasAddGrad that reads the same incoming gradient, and a batch norm with its activation.
A control edge between two ops is harmless in the graph fastt writes, but once such a group
becomes a single kernel it can close a cycle through it (the step then never finishes).
``fusion_groups`` over-approximates the groups so that the rewriter can avoid such edges.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from networkx.utils import UnionFind

from fastt.ir import Graph
from fastt.op_types import CONTRACTIONS, EPILOGUE, NORM_PARTNERS, NORMS


def fusion_groups(graph: Graph, depth: int = 3) -> dict[str, str]:
    """Op -> a representative of the group of ops that may become one kernel with it (ops
    in no group represent themselves). O(n) in the graph size for a fixed ``depth``."""
    groups = UnionFind()
    union = groups.union
    for op in graph:
        if op.type in CONTRACTIONS:
            frontier = [op.name]
            for _ in range(depth):
                frontier = [e.dst for n in frontier for e in graph.consumers(n)
                            if graph[e.dst].type in EPILOGUE]
                for n in frontier:
                    union(op.name, n)
        elif op.type == "BiasAddGrad" and op.inputs:
            for reader in _readers(graph, _source(graph, op.inputs[0].op)):
                if graph[reader].type in CONTRACTIONS:
                    union(op.name, reader)
        if op.type in NORMS:
            for r in op.inputs:
                if graph[r.op].type in NORM_PARTNERS:
                    union(op.name, r.op)
            for e in graph.consumers(op.name):
                if graph[e.dst].type in NORM_PARTNERS:
                    union(op.name, e.dst)
    return {n: groups[n] for n in groups}


def _source(graph: Graph, name: str) -> str:
    """The op behind a chain of Identity ops (grappler removes them before fusing)."""
    while graph[name].type == "Identity" and graph[name].inputs:
        name = graph[name].inputs[0].op
    return name


def _readers(graph: Graph, name: str) -> list[str]:
    """Ops reading ``name``'s outputs, directly or through Identity ops."""
    out: list[str] = []
    stack = [name]
    while stack:
        for e in graph.consumers(stack.pop()):
            (stack if graph[e.dst].type == "Identity" else out).append(e.dst)
    return out


def fusion_hazard(graph: Graph, groups: dict[str, str], a: str, b: str,
                  preds: Mapping[str, Iterable[str]], succs: Mapping[str, Iterable[str]],
                  depth: int = 6) -> bool:
    """Whether a control edge ``a -> b`` could close a cycle through a fused kernel: ``b``
    feeds an op at most 3 data edges below ``a`` (kernels fused along that chain take ``b``
    as an input), or an op near above ``a`` and one near below ``b`` (``depth`` edges of
    ``preds`` / ``succs``: the graph's edges plus the control edges added so far) may fuse."""
    frontier = {a}
    for _ in range(3):
        frontier = {e.dst for n in frontier for e in graph.consumers(n)}
        if any(r.op == b for n in frontier for r in graph[n].inputs):
            return True

    def near(start: str, step: Mapping[str, Iterable[str]]) -> set[str]:
        seen, frontier = {start}, [start]
        for _ in range(depth):
            frontier = [m for n in frontier for m in step[n] if m not in seen]
            seen.update(frontier)
        return {groups.get(n, n) for n in seen}
    return bool(near(a, preds) & near(b, succs))
