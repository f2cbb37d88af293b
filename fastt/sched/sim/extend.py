"""A compiled problem extended to a graph that adds ops to its own and rewires some inputs,
without compiling the whole graph again.

Passes such as ``fastt.sched.placers.transfer_order`` add a few thousand ops to a graph of a few
hundred thousand whose problem is compiled already, and change the inputs of a few thousand more.
``extended`` keeps the problem's ops (their indices, costs, memory, groups and edges) and
compiles only the ops added, in a graph of their own; the edges into the added and rewired ops
are merged as ``Problem.from_graph`` merges them. The result is the problem ``from_graph``
compiles, up to the numbering of ops and edges: the added ops come after the others, their
edges and those of the rewired ops after the rest (the edge numbers they had stay unused).
O(V + E) list copies and a topological sort, plus the added ops' compile.
"""
from __future__ import annotations

from typing import Callable

from fastt import dtypes
from fastt.errors import FasttError
from fastt.ir import Graph
from fastt.op_types import LOOP_TYPES
from fastt.sched.sim.edges import Dag, inputs_by_producer
from fastt.sched.sim.problem import Problem


def extendable(old: Graph, new: Graph) -> tuple[list[str], list[str]] | None:
    """The ops ``new`` adds to ``old`` and the ops of ``old`` it rewires (each in its graph's
    order), when ``extended`` can derive ``new``'s problem from ``old``'s: no op of ``old`` is
    gone or changed but in its inputs, and no edge added or removed joins or parts colocation
    groups or while frames (the added ops name no colocation, carry no reference or resource
    handle, and none of them or their neighbours is in a loop). None otherwise."""
    names, before = new.names, old.names
    if names[:len(before)] == before:  # the usual case: the ops added come last
        made = names[len(before):]
        rewired = [a.name for a, b in zip(old, new) if a is not b]
    else:
        if not set(names).issuperset(before):
            return None
        known = set(before)
        made = [n for n in names if n not in known]
        rewired = [n for n in before if new[n] is not old[n]]
    ops = {n: new[n] for n in rewired + made}
    for n in rewired:
        was = old[n]
        if ops[n].with_(inputs=was.inputs, control_inputs=was.control_inputs) != was:
            return None
    touched = [ops[n] for n in rewired + made]
    if any(ops[n].colocate_with or ops[n].type in LOOP_TYPES for n in made):
        return None
    # an edge added or removed that carries a handle would join or part colocation groups
    # (an update op rewired keeps the edge of its variable's handle: that one may stay)
    for n in rewired + made:
        then, now = set(old[n].inputs if n in old else ()), set(ops[n].inputs)
        if any(dtypes.is_ref_or_resource(old.tensor(ref).dtype) for ref in then - now) or \
                any(dtypes.is_ref_or_resource(new.tensor(ref).dtype) for ref in now - then):
            return None
    frames = old.while_frames()
    if frames:
        inside = {n for members in frames.values() for n in members}
        near = {op.name for op in touched} | {r.op for op in touched for r in op.inputs} | \
            {c for op in touched for c in op.control_inputs}
        if near & inside:
            return None
    return made, rewired


def extended(p: Problem, old: Graph, new: Graph,
             compile_graph: Callable[[Graph], Problem]) -> Problem:
    """``new``'s problem from ``p`` (``old`` compiled), when ``extendable``; else
    ``compile_graph(new)``. The added ops are compiled by ``compile_graph`` in a graph of
    their own (with their producers, inputs cut), so they cost what a compile of ``new``
    would give them."""
    found = extendable(old, new)
    if found is None:
        return compile_graph(new)
    made, rewired_names = found
    if not made and not rewired_names:
        return p
    own = set(made)
    producers = {r.op for n in made for r in new[n].inputs} | \
        {c for n in made for c in new[n].control_inputs}
    cut = [new[n].with_(inputs=(), control_inputs=()) for n in sorted(producers - own)]
    part = compile_graph(Graph(cut + [new[n] for n in made], name=new.name, meta=new.meta))
    n0 = p.n
    names = p.names + made
    index = dict(p.index)
    index.update((n, n0 + k) for k, n in enumerate(made))
    rows = [part.index[n] for n in made]
    rewired = [p.index[n] for n in rewired_names]
    touched = sorted(rewired) + list(range(n0, len(names)))
    back: set[str] = set()  # no loop near the ops touched (``extendable``)
    intos = [(j, inputs_by_producer(new[names[j]], index, back, lambda a: new[names[a]]))
             for j in touched]
    # this problem's edges, those into the touched ops made anew
    dag = Dag.of(list(p.preds) + [[] for _ in made], list(p.succs) + [[] for _ in made],
                 list(p.edge_bytes), list(p.edge_tensors))
    gone: dict[int, set[int]] = {}  # producer -> the rewired ops its edges no longer reach
    for j in rewired:
        for a, _ in dag.preds[j]:
            gone.setdefault(a, set()).add(j)
    for a in gone.keys() | {a for _, into in intos for a in into}:
        if a < n0:  # this problem's list is left as it was
            dag.succs[a] = [(b, e) for b, e in dag.succs[a] if b not in gone.get(a, ())]
    for j in touched:
        dag.preds[j] = []
    dag.add(intos)
    preds, succs = dag.preds, dag.succs
    edge_bytes, edge_tensors = dag.bytes, dag.tensors
    return Problem(
        names=names, devices=p.devices, w=p.w + [part.w[r] for r in rows], preds=preds,
        succs=succs, edge_bytes=edge_bytes, intercept=p.intercept, slope=p.slope,
        mem=p.mem + [part.mem[r] for r in rows], group=p.group + list(range(n0, len(names))),
        topo=_topological_from(p.topo, preds, set(rewired), n0), edge_tensors=edge_tensors,
        persistent=p.persistent + [part.persistent[r] for r in rows], send_cpu=p.send_cpu,
        recv_cpu=p.recv_cpu, call_cpu=p.call_cpu, reach=p.reach, cores=p.cores,
        stream=p.stream + [part.stream[r] for r in rows], knee=p.knee, extra=p.extra)


def _topological_from(topo: list[int], preds: list[list[tuple[int, int]]],
                      rewired: set[int], n0: int) -> list[int]:
    """A topological order of the extended problem from ``topo``, its first ``n0`` ops':
    each rewired op is preceded by whatever it now waits for that is not placed yet (depth
    first), and the added ops nothing waits for come last. Only the rewired and added ops'
    predecessors are read: an op not rewired waits for the same ops as before, all earlier
    in ``topo``. O(n + the edges into the ops placed early)."""
    n = len(preds)
    done = bytearray(n)
    order: list[int] = []

    def place(i: int) -> None:
        stack = [(i, iter(preds[i]))]
        on = {i}
        while stack:
            node, it = stack[-1]
            for a, _ in it:
                if not done[a]:
                    if a in on:
                        raise FasttError("the op graph has a cycle; cannot schedule it")
                    on.add(a)
                    stack.append((a, iter(preds[a])))
                    break
            else:
                stack.pop()
                on.discard(node)
                done[node] = 1
                order.append(node)

    for i in topo:
        if not done[i]:
            if i in rewired:
                place(i)
            else:
                done[i] = 1
                order.append(i)
    for i in range(n0, n):
        if not done[i]:
            place(i)
    return order
