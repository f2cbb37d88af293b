"""OS-DPOS: Operation Splitting with DPOS (FastT, Middleware 2020, Algorithm 2).

Run DPOS; take the critical path of the resulting schedule, its ops by decreasing compute
time; for each, try every split rule of its type and every part count 2..#devices, re-running
DPOS on each split graph; accept the best split if it lowers the predicted step time and go on.
FastT stops at the first op whose best split does not pay; here an op whose split does not
pay alone is tried again as the head of a chain: with the critical-path ops after it that
read it, cut alike (up to ``CHAIN`` ops, sub-op to sub-op, so the cut and the join are paid
once for all of them). The search stops after ``MISSES`` ops in a row that pay neither way (the
budget), so that a split that pays behind one that does not is still found, and after
``BUDGET_S`` seconds (no candidate is begun that would end past it, at the longest a
candidate has taken so far: one on a 110k-op data-parallel graph costs seconds). Ops with
no split rule are passed over. The result is never worse than DPOS on the input graph. Each
candidate costs one DPOS run: O(C * R * D) DPOS runs for C critical-path ops, R rules per op
and D devices (twice that where chains are tried); the candidates of one op are independent
and can be evaluated in parallel (``workers``).
"""
from __future__ import annotations

import logging
import math
import multiprocessing as mp
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from fastt.costs.derived import DerivedCosts, Overheads
from fastt.costs.memory import MemoryModel
from fastt.costs.source import CostSource
from fastt.errors import FasttError
from fastt.ir import Graph
from fastt.sched.placers.dpos import dpos
from fastt.sched.sim.problem import Device, Problem
from fastt.sched.sim.schedule import Schedule
from fastt.passes.split_rules import find, rules
from fastt.passes.splitting import (Split, apply_decisions, decide, parameter_bytes,
                                   split_operation)

log = logging.getLogger("fastt")

Compile = Callable[[Graph], Problem]
#: Critical-path ops in a row whose best split does not pay before the search stops (FastT
#: stops at the first: a split that pays can sit behind one that does not).
MISSES = 3
#: Seconds the split search may take (its share of ``fastt plan``'s minute).
BUDGET_S = 30.0
#: The most ops a chain of splits holds (an op and the critical-path ops after it that read it)
CHAIN = 3


@dataclass
class Plan:
    """A graph (possibly transformed), its compiled problem and DPOS schedule."""
    graph: Graph
    problem: Problem
    schedule: Schedule
    splits: list[Split] = field(default_factory=list)
    tried: int = 0  # DPOS runs spent on candidate splits

    @property
    def makespan(self) -> float:
        return self.schedule.makespan


def schedule_critical_path(p: Problem, s: Schedule, eps: float = 1e-12) -> list[int]:
    """The chain that sets the makespan: from the last op to finish, back through whatever
    made each op wait (a predecessor's data or the device's previous op)."""
    if p.n == 0:
        return []
    prev_on_device: dict[int, int] = {}
    for order in s.device_orders(p.num_devices):
        for a, b in zip(order, order[1:]):
            prev_on_device[b] = a
    j = max(range(p.n), key=lambda i: (s.finish[i], -i))
    path = [j]
    while s.start[j] > eps:
        nxt = None
        for m, e in p.preds[j]:
            if abs(s.finish[m] + p.comm(e, s.device[m], s.device[j]) - s.start[j]) <= 1e-9:
                nxt = m
                break
        if nxt is None:
            prev = prev_on_device.get(j)
            if prev is None or abs(s.finish[prev] - s.start[j]) > 1e-9:
                break
            nxt = prev
        j = nxt
        path.append(j)
    return path[::-1]


Candidate = tuple[str, int, tuple[str, ...]]  # (dimension, parts, the ops split alike)
# what forked workers evaluate: the graph, its compiler, when no candidate may begin, what
# a candidate is expected to take
_CONTEXT: tuple[Graph, Compile, float, float] | None = None
clock = time.perf_counter  # the searches' clock (CLOCK_MONOTONIC: one for forked workers)


def split_chain(graph: Graph, candidate: Candidate) -> Graph:
    """``graph`` with every op of the candidate's chain split on its dimension into its parts
    (in one pass: each reads its predecessor's parts)."""
    dim, n, chain = candidate
    if len(chain) == 1:
        return split_operation(graph, chain[0], dim, n)
    return apply_decisions(graph, {name: decide(graph, name, dim, n) for name in chain})


def _chain(graph: Graph, path: list[str], name: str, dim: str, n: int) -> tuple[str, ...]:
    """``name`` and the ops after it on the critical ``path`` that read the one before them
    and split on ``dim`` into ``n`` (at most ``CHAIN``)."""
    out = [name]
    for nxt in path[path.index(name) + 1:]:
        if len(out) == CHAIN or nxt not in graph:
            break
        op = graph[nxt]
        rule = find(op, graph, dim)
        if not any(r.op == out[-1] for r in op.inputs) or rule is None or \
                (rule.base(op, graph) or 0) < n:
            break
        out.append(nxt)
    return tuple(out)


def _makespan(candidate: Candidate) -> tuple[float | None, float]:
    """DPOS's step time for the current graph with one more split (None if refused, or
    not begun: it would end past the search's budget), and the seconds it took."""
    assert _CONTEXT is not None
    graph, compile_graph, deadline, expected_s = _CONTEXT
    t0 = clock()
    if t0 + expected_s > deadline:
        return None, 0.0
    try:
        return dpos(compile_graph(split_chain(graph, candidate))).makespan, clock() - t0
    except FasttError as e:
        log.debug("split %s refused: %s", candidate, e)
        return None, clock() - t0


def _evaluate(graph: Graph, compile_graph: Compile, candidates: list[Candidate],
              workers: int, deadline: float = math.inf, expected_s: float = 0.0
              ) -> list[tuple[float | None, float]]:
    """Step time of every candidate split that would end before ``deadline`` (``clock()``)
    were it to take ``expected_s``, and the seconds each took, on ``workers`` forked
    processes."""
    global _CONTEXT
    _CONTEXT = (graph, compile_graph, deadline, expected_s)
    try:
        if workers > 1 and len(candidates) > 1 and "fork" in mp.get_all_start_methods():
            with mp.get_context("fork").Pool(min(workers, len(candidates))) as pool:
                return pool.map(_makespan, candidates, chunksize=1)
        return [_makespan(c) for c in candidates]
    finally:
        _CONTEXT = None


def os_dpos(graph: Graph, compile_graph: Compile, num_devices: int,
            max_parts: int | None = None, start: Plan | None = None,
            workers: int = 1, budget_s: float | None = BUDGET_S,
            candidate_s: float = 0.0) -> Plan:
    """Split critical-path ops of ``graph`` while DPOS predicts a shorter step. ``start``
    gives the starting plan (default: DPOS on ``graph``; the result is never worse than it).
    Candidate splits are evaluated on ``workers`` processes; none is begun that would end
    after ``budget_s`` seconds (None: no limit) were it to take the longest a candidate has
    taken, ``candidate_s`` before the first."""
    t0 = clock()
    deadline = math.inf if budget_s is None else t0 + budget_s
    if start is None:
        p = compile_graph(graph)
        start = Plan(graph, p, dpos(p))
    best = start
    p, s = best.problem, best.schedule
    cp = schedule_critical_path(p, s)
    path = [p.names[i] for i in cp]
    cp_names = [p.names[i] for i in sorted(cp, key=lambda i: -p.w[i][s.device[i]])]
    top = min(max_parts or num_devices, num_devices)
    misses = 0
    longest = max(candidate_s, 0.0)  # seconds of the longest candidate evaluated so far
    for name in cp_names:
        if clock() + longest > deadline:
            log.info("OS-DPOS: the split search stopped at its %.0f s budget (%d DPOS runs, "
                     "%d splits)", budget_s, best.tried, len(best.splits))
            break
        if name not in best.graph:
            continue
        op = best.graph[name]
        alone: list[Candidate] = [(r.dim, n, (name,)) for r in rules(op, best.graph)
                                  for n in range(2, top + 1) if (r.base(op, best.graph) or 0) >= n]
        if not alone:
            continue
        found, longest = _best(best, compile_graph, alone, workers, deadline, longest)
        if found is None:  # the op alone does not pay: with the ops after it, cut alike
            chains = [c for c in {(d, n, _chain(best.graph, path, name, d, n))
                                  for d, n, _ in alone} if len(c[2]) > 1]
            if chains:
                found, longest = _best(best, compile_graph, sorted(chains), workers, deadline,
                                       longest)
        if found is None:
            misses += 1
            if misses >= MISSES:
                break
            continue
        misses = 0
        g2 = split_chain(best.graph, found)
        p2 = compile_graph(g2)
        s2 = dpos(p2)
        bp, bs = best.problem, best.schedule
        dim, n, chain = found
        made = [Split(c, dim, n, time_before_s=bp.w[bp.index[c]][bs.device[bp.index[c]]],
                      param_bytes=parameter_bytes(best.graph, best.graph[c]),
                      step_before_s=best.makespan, step_after_s=s2.makespan) for c in chain]
        log.debug("split %s on %s into %d: %.6f -> %.6f s", ", ".join(chain), dim, n,
                  best.makespan, s2.makespan)
        best = Plan(g2, p2, s2, best.splits + made, best.tried)
    return best


def _best(plan: Plan, compile_graph: Compile, candidates: list[Candidate],
          workers: int, deadline: float = math.inf, longest: float = 0.0
          ) -> tuple[Candidate | None, float]:
    """The candidate with the shortest DPOS step when shorter than ``plan``'s (its DPOS
    runs counted in ``plan.tried``), else None; and the seconds of the longest candidate
    evaluated so far, ``longest`` those before these (none begins that would end past
    ``deadline`` were it to take that long)."""
    results = _evaluate(plan.graph, compile_graph, candidates, workers, deadline, longest)
    longest = max([longest] + [seconds for _, seconds in results])
    spans = [t for t, _ in results]
    plan.tried += sum(t is not None for t in spans)
    scored = [(t, c) for t, c in zip(spans, candidates) if t is not None]
    if not scored or min(scored)[0] >= plan.makespan:
        return None, longest
    return min(scored)[1], longest


def compiler(devices: Sequence[Device], costs: CostSource, original: Graph,
             copy_bytes_per_s: float = 10e9) -> Compile:
    """A ``Compile`` for graphs derived from ``original``: sub-op costs derived from the
    whole ops', memory from each graph's own variables and output sizes."""
    overheads = Overheads(original, costs)
    memo: dict[tuple[object, ...], list[float]] = {}

    def compile_graph(g: Graph) -> Problem:
        mem = MemoryModel.from_graph(g)
        return Problem.from_graph(g, devices, DerivedCosts(costs, g, overheads,
                                                           copy_bytes_per_s, memo),
                                  mem={op.name: mem.op_bytes(op.name) for op in g},
                                  persistent=mem.persistent)
    return compile_graph
