"""Recomputation on the IR (gradient checkpointing, Chen et al. 2016, "Training Deep Nets with
Sublinear Memory Cost"): forward activations the backward pass reads are not kept from the
forward pass but computed again from the nearest kept ones (the checkpoints) when the backward
pass reaches them.

``recompute(graph, checkpoints)`` copies, for every forward tensor a gradient op reads that is
not a checkpoint, the forward ops that compute it from checkpoints, variables, constants and
the batch (``fastt_recompute/<op>``, ``OpMeta.origin`` the op copied: it costs what its origin
costs); the gradient ops read the copies. So that the copies run late, each copy that reads no
other copy waits (a control edge) for the gradient ops' inputs that arrive from the backward
pass where its copies are read: the backward pass has reached them then. Forward ops the
backward pass no longer reads free their outputs as soon as the forward pass is done with them.

The copies compute what the originals did, bit for bit (the same kernels on the same inputs).
A random op is copied only where it is seeded (its copy, seeded alike, draws what the original
draws at every step); an unseeded or other stateful op is never copied: its output is kept, as
a checkpoint's is. Each pass returns a new graph, O(ops + edges).
"""
from __future__ import annotations

from typing import Collection

from fastt.errors import Declined
from fastt.ir import Graph, Op, OpMeta, TensorRef
from fastt.op_types import BATCH_SOURCES, FREE, VARIABLE_TYPES

COPY = "fastt_recompute/"  # the prefix of a recomputed op's name
SMALL_BYTES = 64 * 2 ** 10  # an output kept rather than recomputed (``small_ops``)
SEEDED = frozenset({"RandomStandardNormal", "RandomUniform", "RandomUniformInt",
                    "TruncatedNormal"})


def gradient_of(name: str) -> str | None:
    """The forward op a TF1 gradient op was made for ("gradients/a/b_grad/Mul" -> "a/b"; ""
    when the gradients scope names none), or None when ``name`` is not under a gradients
    scope."""
    parts = name.split("/")
    scopes = [k for k, c in enumerate(parts) if c == "gradients" or c.startswith("gradients_")]
    if not scopes:
        return None
    rest = parts[scopes[-1] + 1:]
    for k, c in enumerate(rest):
        if c.endswith("_grad"):
            return "/".join(rest[:k] + [c[:-len("_grad")]])
    return ""


def forward_ops(graph: Graph) -> list[str]:
    """The forward pass: the ops neither under a gradients scope nor after one (the updates),
    in topological order."""
    after: set[str] = set()
    out = []
    for n in graph.topological_order():
        if gradient_of(n) is not None or any(p in after for p in graph.predecessors(n)):
            after.add(n)
        else:
            out.append(n)
    return out


def recomputable(op: Op) -> bool:
    """Whether ``op`` may be computed again: it computes from its inputs alone (a seeded
    random op draws alike in its copy), and is not kept at no cost anyway (a variable, its
    read, a constant, the batch input)."""
    if op.is_variable or op.type in VARIABLE_TYPES or op.type in FREE or \
            op.type in BATCH_SOURCES or not op.outputs:
        return False
    if op.type in SEEDED:
        return bool(op.attrs.get("seed") or op.attrs.get("seed2"))
    return not op.stateful


def activations(graph: Graph, forward: list[str] | None = None) -> list[str]:
    """The recomputable forward ops whose outputs a gradient op reads (what a forward pass
    keeps for the backward pass), in topological order: the candidate checkpoints.
    ``forward`` is ``forward_ops(graph)`` when the caller has it."""
    read = {i.op for n in graph.names if gradient_of(n) is not None for i in graph[n].inputs}
    return [n for n in (forward_ops(graph) if forward is None else forward)
            if n in read and recomputable(graph[n])]


def cut_points(graph: Graph, small_bytes: int = SMALL_BYTES) -> list[str]:
    """The activations every path of the forward pass crosses, in topological order: no
    forward op before one is read after it, so recomputing from it never reaches further
    back (the bottlenecks of Bulatov's memory-saving gradients; Chen et al. 2016 checkpoint
    the layers of a chain). Edges out of what is kept anyway (variables, constants, the
    batch, ``small_ops``) jump over freely. O(ops + edges)."""
    forward = forward_ops(graph)
    pos = {n: i for i, n in enumerate(forward)}
    kept = set(small_ops(graph, small_bytes, forward))
    acts = set(activations(graph, forward))
    out: list[str] = []
    furthest = -1  # the furthest forward op read from before the current one
    for i, n in enumerate(forward):
        if furthest <= i and n in acts:
            out.append(n)
        if n not in kept and recomputable(graph[n]):
            furthest = max([furthest] + [pos.get(s, -1) for s in graph.successors(n)])
    return out


def small_ops(graph: Graph, small_bytes: int = SMALL_BYTES,
              forward: list[str] | None = None) -> list[str]:
    """The recomputable forward ops whose outputs hold at most ``small_bytes`` together
    (shapes, scalars, masks of a few rows): kept rather than computed again, at no
    noticeable memory. ``forward`` is ``forward_ops(graph)`` when the caller has it."""
    return [n for n in (forward_ops(graph) if forward is None else forward)
            if recomputable(graph[n]) and
            sum(small_bytes + 1 if t.nbytes is None else t.nbytes
                for t in graph[n].outputs) <= small_bytes]


def recompute(graph: Graph, checkpoints: Collection[str]) -> Graph:
    """``graph`` with the forward tensors its gradient ops read recomputed from
    ``checkpoints`` (see the module docstring); ``Declined`` when nothing would be."""
    kept = set(checkpoints)
    forward = set(forward_ops(graph))
    copied: dict[str, str] = {}  # forward op -> its copy

    def copy_of(n: str) -> bool:
        return n in forward and n not in kept and recomputable(graph[n])

    # the copies, each after the copies it reads (topological: the originals' order)
    wanted: set[str] = set()
    stack = [i.op for n in graph.names if gradient_of(n) is not None
             for i in graph[n].inputs if copy_of(i.op)]
    while stack:
        n = stack.pop()
        if n in wanted:
            continue
        wanted.add(n)
        stack += [i.op for i in graph[n].inputs if copy_of(i.op) and i.op not in wanted]
    if not wanted:
        raise Declined("no forward activation the backward pass reads can be recomputed")
    order = [n for n in graph.topological_order() if n in wanted]
    made: dict[str, Op] = {}
    for n in order:
        op = graph[n]
        copied[n] = COPY + n
        made[n] = op.with_(
            name=COPY + n,
            inputs=tuple(TensorRef(copied[i.op], i.index) if i.op in copied else i
                         for i in op.inputs),
            meta=OpMeta(origin=op.meta.origin or n, fraction=op.meta.fraction))
    readers: dict[str, list[Op]] = {}  # copied op -> the gradient ops that read its copy
    changed: dict[str, Op] = {}
    for op in graph:
        if gradient_of(op.name) is None or not any(i.op in copied for i in op.inputs):
            continue
        changed[op.name] = op.with_(inputs=tuple(
            TensorRef(copied[i.op], i.index) if i.op in copied else i for i in op.inputs))
        for i in op.inputs:
            if i.op in copied:
                readers.setdefault(i.op, []).append(op)
    out = Graph([changed.get(op.name, op) for op in graph] + list(made.values()),
                name=graph.name, meta=graph.meta)
    return out.replace_ops(_waits(out, graph, readers, copied))


def _waits(out: Graph, graph: Graph, readers: dict[str, list[Op]], copied: dict[str, str]
           ) -> dict[str, Op]:
    """Each root copy (it reads no other copy) of ``out`` with control inputs: the inputs,
    from the backward pass, of the gradient ops that read the copies computed from it, less
    those that come after it (they would wait for themselves)."""
    roots: dict[str, set[str]] = {}  # copied op -> the root copies its copy is computed from
    for n in (n for n in graph.topological_order() if n in copied):
        ins = [i.op for i in graph[n].inputs if i.op in copied]
        roots[n] = {n} if not ins else set().union(*(roots[i] for i in ins))
    bit = {copied[r]: 1 << k for k, r in enumerate(sorted({r for v in roots.values()
                                                           for r in v}))}
    after: dict[str, int] = {}  # op -> the root copies it comes after, as bits
    for n in out.topological_order():
        m = bit.get(n, 0)
        for p in out.predecessors(n):
            m |= after[p]
        after[n] = m
    waits: dict[str, set[str]] = {}
    for n, ops in readers.items():
        arriving = {i.op for b in ops for i in b.inputs
                    if gradient_of(i.op) is not None and i.op not in copied}
        for r in roots[n]:
            c = copied[r]
            waits.setdefault(c, set()).update(w for w in arriving if not after[w] & bit[c])
    return {c: out[c].with_(control_inputs=out[c].control_inputs + tuple(sorted(w)))
            for c, w in waits.items() if w}
