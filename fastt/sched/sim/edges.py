"""The merged edges of a compiled problem (``fastt.sched.sim.problem.Problem``): one edge per
(producer, consumer) pair of ops, carrying its distinct tensors and their bytes, numbered in
the order added. ``Problem.build`` merges plain edges, ``Problem.from_graph`` a graph's (in C
where ``_simedges.c`` was built), ``fastt.sched.sim.extend`` the edges of the ops it touches."""
from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

from fastt.errors import FasttError
from fastt.ir import Op
from fastt.sched.sim._native import simcore


def graph_edges(ops: Sequence[Op], index: Mapping[str, int], back: set[str],
                compiled: bool = True) -> "Dag":
    """The merged edges of ``ops`` (in their problem's order; ``index``: name -> position)
    as ``build`` merges them, the inputs out of the ops named in ``back`` (loop back edges)
    left out: each data input's tensor with its output's bytes, each control input an edge
    of no tensor. Compiled (``_simedges.c``) unless ``compiled`` is False or it was not
    built."""
    if compiled and simcore is not None:
        return Dag.of(*simcore.graph_edges(ops, index, back))
    dag = Dag(len(ops))
    dag.add((j, inputs_by_producer(op, index, back, ops.__getitem__))
            for j, op in enumerate(ops))
    return dag


def inputs_by_producer(op: Op, index: Mapping[str, int], back: set[str],
                       op_at: Callable[[int], Op]) -> dict[int, dict[object, float]]:
    """``op``'s producers (by ``index``; ``op_at``: the op at an index), each with the
    tensors it sends ``op`` and their bytes, in the order first named: data inputs, then
    control inputs (no tensor); inputs out of the ops named in ``back`` left out."""
    into: dict[int, dict[object, float]] = {}
    for ref in op.inputs:
        if ref.op not in back:
            a = index[ref.op]
            tensors = into.get(a)
            if tensors is None:
                tensors = into[a] = {}
            tensors[ref] = float(op_at(a).outputs[ref.index].nbytes or 0)
    for c in op.control_inputs:
        if c not in back:
            into.setdefault(index[c], {})
    return into


class Dag:
    """The merged edges of a ``Problem`` as they are added: one edge per (producer,
    consumer) pair, carrying its distinct tensors, numbered in the order added."""

    def __init__(self, n: int) -> None:
        self.preds: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self.succs: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self.bytes: list[float] = []
        self.tensors: list[list[tuple[object, float]]] = []

    @classmethod
    def of(cls, preds: list[list[tuple[int, int]]], succs: list[list[tuple[int, int]]],
           edge_bytes: list[float], tensors: list[list[tuple[object, float]]]) -> "Dag":
        """The edges already merged into these lists (which it takes, not copies)."""
        dag = cls(0)
        dag.preds, dag.succs, dag.bytes, dag.tensors = preds, succs, edge_bytes, tensors
        return dag

    def add(self, intos: Iterable[tuple[int, dict[int, dict[object, float]]]]) -> None:
        """Each consumer's edges, as (consumer, producer -> the tensors it sends); one call
        for all (compiling is a hot loop of OS-DPOS)."""
        preds, succs, edge_bytes, edge_tensors = self.preds, self.succs, self.bytes, \
            self.tensors
        e = len(edge_bytes)
        for b, into in intos:
            if b in into:
                raise FasttError(f"edge from op {b} to itself")
            pb = preds[b]
            for a, tensors in into.items():
                pb.append((a, e))
                succs[a].append((b, e))
                total = 0.0  # in order, as the compiled edges add (not ``sum``'s way)
                for nbytes in tensors.values():
                    total += nbytes
                edge_bytes.append(float(total))
                edge_tensors.append(list(tensors.items()))
                e += 1
