"""Hybrid data/model parallelism: weights kept whole on one device, the rest data parallel.

FastT (Middleware 2020, section 7, Table 5) found that on VGG-19 the fully connected layers,
large parameters and little compute, run best unreplicated on one device while the
convolutions stay data parallel: their weights and gradients then never cross a link, only
their activations (a few rows of features) do. ``keep_whole`` finds such weights by a
dedicated pass on the data-parallel graph, not by DPOS: DPOS places one op at a time by its
earliest finish, and moving one replica of a layer to another device never pays on its own
(the gradient still has to be summed across devices); only the whole layer, forward and
backward, on one device does.

A weight here is a variable a dense optimizer update writes, with the ops of the step that
carry the batch and read it (the forward op, the gradient with respect to its input) and the
ops that make its gradient (traced back from the update while their output has the weight's
size, so a bias's gradient summed over the batch with its dimensions kept is one of them; only
through element-wise ops and views: the contraction or reduction that makes the gradient is
one of them, not its inputs, the batch's activations, which can have the weight's size by
chance, as in BERT-large at batch 16 and length 64, where a batch of 1024 rows of 1024
features has its query kernel's size).
``weights`` lists them in O(V + E). ``keep_whole`` tries them greedily, most promising
first, keeping each that shortens the simulated step: O(K) data-parallel graphs and
replays for K candidates.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from fastt.ir import Graph, Op, TensorRef, writes_variable
from fastt.op_types import ALIASING_TYPES, BINARY, READS, SHAPE_OPS, UNARY
from fastt.passes.data_parallel import batch_ops

log = logging.getLogger("fastt")

#: The most weights tried, and the seconds the search may take (it finishes the one it is on).
CANDIDATES = 8
BUDGET_S = 20.0
#: What a weight's gradient is traced back through: sums, scalings, views.
_THROUGH = UNARY | BINARY | ALIASING_TYPES | {"Transpose"}


@dataclass(frozen=True)
class Weight:
    variable: str
    nbytes: int
    ops: frozenset[str]  # the batch-carrying ops kept whole with it


def weights(graph: Graph) -> list[Weight]:
    """The weights of ``graph`` with a dense update and batch-carrying ops that read it or make
    its gradient (see the module docstring), in the graph's order."""
    region = set(batch_ops(graph))
    reads_of: dict[str, list[Op]] = {}
    for op in graph:
        if op.type in READS and op.inputs and op.outputs:
            reads_of.setdefault(op.inputs[0].op, []).append(op)
    out: list[Weight] = []
    seen: set[str] = set()
    for update in graph:
        if not writes_variable(update) or "Apply" not in update.type or \
                "Sparse" in update.type or not update.inputs:
            continue
        var = graph[update.inputs[0].op]
        if not var.is_variable or var.name in seen:
            continue
        seen.add(var.name)
        reads = reads_of.get(var.name, [])
        shape = reads[0].outputs[0].dims if reads else None
        if not shape:
            continue
        ops = {e.dst for r in reads for e in graph.consumers(r.name)
               if e.dst in region and graph[e.dst].type not in SHAPE_OPS}
        size = math.prod(shape)

        def sized(r: TensorRef) -> bool:
            dims = graph.tensor(r).dims
            return r.op in region and dims is not None and math.prod(dims) == size
        stack = [r.op for r in update.inputs if sized(r)]
        while stack:  # back from the update while the tensors are the weight's size
            name = stack.pop()
            if name in ops:
                continue
            ops.add(name)
            if graph[name].type in _THROUGH:
                stack += [r.op for r in graph[name].inputs if sized(r)]
        if ops:
            out.append(Weight(var.name, reads[0].outputs[0].nbytes or 0, frozenset(ops)))
    return out


def promising(candidates: Sequence[Weight], compute_s: Callable[[Weight], float],
              seconds_per_byte: float, n: int) -> list[Weight]:
    """The weights whose gradient traffic in data parallelism (2 (n-1)/n of its bytes over the
    slowest link, as the ring and the parameter server both send) outweighs half the compute
    lost by running its ops whole (their time times (n-1)/n), by decreasing ratio; at most
    ``CANDIDATES``."""
    scored = []
    for w in candidates:
        traffic = 2 * w.nbytes * seconds_per_byte
        lost = compute_s(w)
        if traffic > 0.5 * lost:
            scored.append((traffic / max(lost, 1e-12), w))
    scored.sort(key=lambda sw: -sw[0])
    return [w for _, w in scored[:CANDIDATES]]


def keep_whole(candidates: Sequence[Weight], build: Callable[[frozenset[str]], Graph | None],
               step_time: Callable[[Graph], float], budget_s: float | None = BUDGET_S,
               candidate_s: float = 0.0) -> tuple[Graph | None, list[Weight]]:
    """Greedily keep whole each candidate (in turn) whose ops, run whole with those kept
    before, shorten ``step_time`` of the graph ``build`` makes (None: it does not fit);
    the best graph (None when none fits) and the weights kept. No candidate is begun that
    would end past ``budget_s`` seconds, each taken to cost ``candidate_s``, or what those
    tried took on average when more."""
    t0 = time.perf_counter()
    best = build(frozenset())
    best_t = step_time(best) if best is not None else float("inf")
    kept: list[Weight] = []
    begun = time.perf_counter()
    for tried, w in enumerate(candidates):
        if tried:
            candidate_s = max(candidate_s, (time.perf_counter() - begun) / tried)
        spent = max(time.perf_counter() - t0, tried * candidate_s)
        if budget_s is not None and spent + candidate_s > budget_s:
            log.info("hybrid: the search stopped at its %.0f s budget (%d of %d weights "
                     "tried)", budget_s, tried, len(candidates))
            break
        whole = frozenset().union(w.ops, *(k.ops for k in kept))
        g = build(whole)
        if g is None:
            continue
        t = step_time(g)
        log.debug("hybrid: %s kept whole: %.6f -> %.6f s", w.variable, best_t, t)
        if t < best_t:
            best, best_t = g, t
            kept.append(w)
    return best, kept


def kept_whole(model: Graph, plan: Graph, found: Sequence[Weight] | None = None) -> list[str]:
    """The weights of ``model`` (``found``: ``weights(model)`` when the caller has it) whose ops
    run whole in ``plan`` (a data-parallel graph)."""
    return [w.variable for w in (weights(model) if found is None else found)
            if all(o in plan and plan[o].meta.join is None and plan[o].meta.origin is None and
                   plan[o].type == model[o].type for o in w.ops)]

