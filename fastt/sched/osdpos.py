"""OS-DPOS: Operation Splitting with DPOS (FastT, Middleware 2020, Algorithm 2).

Run DPOS; take the critical path of the resulting schedule, its ops by decreasing compute
time; for each, try every split rule of its type and every part count 2..#devices, re-running
DPOS on each split graph; accept the best split if it lowers the predicted step time and go on.
FastT stops at the first op whose best split does not pay; here the search stops after
``MISSES`` such ops in a row (the budget), so that a split that pays behind one that does not
is still found, and after ``BUDGET_S`` seconds (it finishes the op it is on: a candidate on a
110k-op data-parallel graph costs seconds). Ops with no split rule are passed over. The result
is never worse than DPOS on the input graph. Each candidate costs one DPOS run: O(C * R * D)
DPOS runs for C critical-path ops, R rules per op and D devices; the candidates of one op are
independent and can be evaluated in parallel (``workers``).
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from fastt.costs.derived import DerivedCosts, Overheads
from fastt.costs.memory import MemoryModel
from fastt.costs.source import CostSource
from fastt.errors import FasttError
from fastt.ir import Graph
from fastt.sched.dpos import dpos
from fastt.sched.problem import Device, Problem
from fastt.sched.schedule import Schedule
from fastt.sched.split_rules import rules
from fastt.sched.splitting import Split, parameter_bytes, split_operation

log = logging.getLogger("fastt")

Compile = Callable[[Graph], Problem]
#: Critical-path ops in a row whose best split does not pay before the search stops (FastT
#: stops at the first: a split that pays can sit behind one that does not).
MISSES = 3
#: Seconds the split search may take (its share of ``fastt plan``'s minute).
BUDGET_S = 30.0


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


_CONTEXT: tuple[Graph, Compile, str] | None = None  # what forked workers evaluate


def _makespan(candidate: tuple[str, int]) -> float | None:
    """DPOS's step time for the current graph with one more split (None if refused)."""
    assert _CONTEXT is not None
    graph, compile_graph, name = _CONTEXT
    try:
        return dpos(compile_graph(split_operation(graph, name, *candidate))).makespan
    except FasttError as e:
        log.debug("split %s %s refused: %s", name, candidate, e)
        return None


def _evaluate(graph: Graph, compile_graph: Compile, name: str,
              candidates: list[tuple[str, int]], workers: int) -> list[float | None]:
    """Step time of every candidate split of op ``name``, on ``workers`` forked processes."""
    global _CONTEXT
    _CONTEXT = (graph, compile_graph, name)
    try:
        if workers > 1 and len(candidates) > 1 and "fork" in mp.get_all_start_methods():
            with mp.get_context("fork").Pool(min(workers, len(candidates))) as pool:
                return pool.map(_makespan, candidates, chunksize=1)
        return [_makespan(c) for c in candidates]
    finally:
        _CONTEXT = None


def os_dpos(graph: Graph, compile_graph: Compile, num_devices: int,
            max_parts: int | None = None, start: Plan | None = None,
            workers: int = 1, budget_s: float | None = BUDGET_S) -> Plan:
    """Split critical-path ops of ``graph`` while DPOS predicts a shorter step. ``start``
    gives the starting plan (default: DPOS on ``graph``; the result is never worse than it).
    Candidate splits are evaluated on ``workers`` processes; no op is begun after
    ``budget_s`` seconds (None: no limit)."""
    t0 = time.perf_counter()
    if start is None:
        p = compile_graph(graph)
        start = Plan(graph, p, dpos(p))
    best = start
    p, s = best.problem, best.schedule
    cp = schedule_critical_path(p, s)
    cp_names = [p.names[i] for i in sorted(cp, key=lambda i: -p.w[i][s.device[i]])]
    top = min(max_parts or num_devices, num_devices)
    misses = 0
    for name in cp_names:
        if budget_s is not None and time.perf_counter() - t0 > budget_s:
            log.info("OS-DPOS: the split search stopped at its %.0f s budget (%d DPOS runs, "
                     "%d splits)", budget_s, best.tried, len(best.splits))
            break
        if name not in best.graph:
            continue
        op = best.graph[name]
        candidates = [(r.dim, n) for r in rules(op, best.graph)
                      for n in range(2, top + 1) if (r.base(op, best.graph) or 0) >= n]
        if not candidates:
            continue
        spans = _evaluate(best.graph, compile_graph, name, candidates, workers)
        best.tried += sum(t is not None for t in spans)
        scored = [(t, c) for t, c in zip(spans, candidates) if t is not None]
        if not scored or min(scored)[0] >= best.makespan:
            misses += 1
            if misses >= MISSES:
                break
            continue
        misses = 0
        dim, n = min(scored)[1]
        g2 = split_operation(best.graph, name, dim, n)
        p2 = compile_graph(g2)
        s2 = dpos(p2)
        bp, bs = best.problem, best.schedule
        i = bp.index[name]
        split = Split(name, dim, n, time_before_s=bp.w[i][bs.device[i]],
                      param_bytes=parameter_bytes(best.graph, op),
                      step_before_s=best.makespan, step_after_s=s2.makespan)
        log.debug("split %s on %s into %d: %.6f -> %.6f s", name, split.dim, split.n,
                 best.makespan, s2.makespan)
        best = Plan(g2, p2, s2, best.splits + [split], best.tried)
    return best


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
