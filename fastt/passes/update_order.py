"""Reads of a variable that come before its update, kept so through a rewrite.

A training step reads its variables (the forward pass, an L2 penalty, a summary) and then
overwrites them in place; TensorFlow orders a read before an update only through the
graph's paths. A reference variable's read (``w/read``, an ``Identity``) aliases its buffer:
whatever consumes it reads the buffer as it is when that consumer runs, so the consumers are
the reads. A rewrite (batch cut in replicas, shapes folded, ops split, weights mirrored) that
loses such a path lets the read see the step's new value. ``lost_update_orders`` names the
reads that preceded an update in the original graph and no longer do in the rewritten one
(ops of the rewritten graph stand for the original op they are a part or a copy of:
``OpMeta.origin``).
"""
from __future__ import annotations

from collections import defaultdict

from fastt.ir import Graph, writes_variable
from fastt.op_types import ALIASING_TYPES, READS


def variable_reads(graph: Graph) -> dict[str, set[str]]:
    """Op -> the variables whose values it reads: a resource variable's ``ReadVariableOp``
    (its value as it runs); a reference variable's ``w/read`` only aliases the buffer, so
    the ops consuming that alias (through ops that alias it again) are its reads."""
    out: dict[str, set[str]] = defaultdict(set)
    for var in graph:
        if not var.is_variable:
            continue
        ref = bool(var.outputs) and var.outputs[0].dtype.endswith("_ref")
        todo = [e.dst for e in graph.consumers(var.name)
                if graph[e.dst].type in READS and not writes_variable(graph[e.dst])]
        aliases: set[str] = set()  # READS are aliasing types too
        while todo:
            name = todo.pop()
            if ref and graph[name].type in ALIASING_TYPES:
                if name not in aliases:
                    aliases.add(name)
                    todo += [e.dst for e in graph.consumers(name)
                             if not writes_variable(graph[e.dst])]
            else:
                out[name].add(var.name)
    return dict(out)


def variable_updates(graph: Graph) -> dict[str, str]:
    """Op -> the variable it overwrites in place (an optimizer's apply, an assign)."""
    return {op.name: op.inputs[0].op for op in graph
            if writes_variable(op) and op.inputs and graph[op.inputs[0].op].is_variable}


def reads_before_updates(graph: Graph) -> set[tuple[str, str]]:
    """(read, update) of the same variable where the read is an ancestor of the update."""
    return _orders(graph, _by_variable(variable_reads(graph)))


def _orders(graph: Graph, of_var: dict[str, list[str]]) -> set[tuple[str, str]]:
    """``reads_before_updates`` given each variable's reads. One pass in topological order,
    each op's ancestor reads a bit set: O(V + E) unions of at most as many bits as reads."""
    updates = variable_updates(graph)
    bit = {name: 1 << i for i, name in enumerate({r for rs in of_var.values() for r in rs})}
    seen: dict[str, int] = {}
    pairs: set[tuple[str, str]] = set()
    for name in graph.topological_order():
        mask = 0
        for p in graph.predecessors(name):
            mask |= seen.get(p, 0)
        if name in updates:
            pairs.update((r, name) for r in of_var[updates[name]] if mask & bit[r])
        seen[name] = mask | bit.get(name, 0)
    return pairs


def lost_update_orders(original: Graph, rewritten: Graph) -> list[tuple[str, str]]:
    """(read, update) pairs of ``rewritten`` on one variable where the op the read stands for
    came before the op the update stands for in ``original``, and the read no longer comes
    before the update. A read whose value no op reads any more (a batch norm's moving mean,
    unused in training, once the batch norm is split) is left out."""
    before = reads_before_updates(original)
    if not before:
        return []
    of_var = _by_variable(variable_reads(rewritten))
    kept = _orders(rewritten, of_var)

    def origin(name: str) -> str:
        return rewritten[name].meta.origin or name

    def dead(r: str) -> bool:  # read before the rewrite, unread after it
        o = origin(r)
        return not rewritten.successors(r) and o in original and bool(original.successors(o))
    return sorted((r, u) for u, v in variable_updates(rewritten).items() for r in of_var[v]
                  if (r, u) not in kept and (origin(r), origin(u)) in before and not dead(r))


def _by_variable(reads: dict[str, set[str]]) -> defaultdict[str, list[str]]:
    """Variable -> the ops that read it."""
    out: defaultdict[str, list[str]] = defaultdict(list)
    for name, variables in reads.items():
        for v in variables:
            out[v].append(name)
    return out
