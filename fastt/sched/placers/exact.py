"""Exact placement and order for small graphs: a mixed-integer program solved by HiGHS.

NetSplit's formulation (seed 000: makespan over the whole step, per-pair linear transfer times,
memory capacities, co-placed groups) on fastt's ``Problem``, with DPOS's model of a step
(one compute stream per device, links without contention):

    minimise  C
    s.t.      sum_d x[g][d] = 1                                 each colocation group g
              sum_g mem[g] x[g][d] <= capacity[d]               each device d
              q_e >= c_e(d, d') (x[g(i)][d] + x[g(j)][d'] - 1)  edge e = i -> j, d != d'
              s_j >= s_i + sum_d w[i][d] x[g(i)][d] + q_e       each edge
              C >= s_i + sum_d w[i][d] x[g(i)][d]               each sink i
              s_k >= s_i + w[i][d] - M (3 - o_ik - x[g(i)][d] - x[g(k)][d])   and the
              s_i >= s_k + w[k][d] - M (2 + o_ik - x[g(i)][d] - x[g(k)][d])   reverse, for
                          every device d and every pair i, k that no path orders
              x, o binary; 0 <= s, C <= U

``U`` (and the big-M, ``U`` plus the longest op) is the makespan of the best list schedule
(one device, DPOS, HEFT, m-ETF), a feasible point of the same model; times are in units of
``U`` (a step of microsecond ops would sit below the solver's tolerances). The solver runs for at
most ``time_limit`` seconds; when it stops before proving optimality the result carries its
gap to the dual bound, and when its best point is no better than that list schedule, the list
schedule is returned with the solver's bound (so the gap stays honest). Graphs above
``MAX_OPS`` ops are declined: O(n^2 D) rows for n ops and D devices, and so are programs of
more than ``MAX_ROWS`` rows (the transfer rows are O(E D^2)). Identical devices are
interchangeable, so they are numbered in the order the groups first use them (group g on a
device below g + 1). On this 2-core machine HiGHS proves the optimum of random 18-op graphs
on 2-4 devices in seconds; a 232-op CNN step on 2 devices (about 20k unordered pairs) reaches
no better point than the list schedules in 10 s.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from fastt.errors import Declined, DoesNotFit
from fastt.sched.placers import baselines
from fastt.sched.placers.dpos import dpos
from fastt.sched.sim.problem import Problem
from fastt.sched.sim.schedule import Schedule, by_start

log = logging.getLogger("fastt")

#: Ops above which the program is not built (the rows grow with the square of the ops).
MAX_OPS = 300
#: Seconds HiGHS may search.
TIME_LIMIT_S = 10.0
#: The most rows built (a 210-op CNN step over 64 devices would have 1.75M: 13 s on 2 cores,
# past its 10 s limit before HiGHS found anything; 300 ops over 8 devices have at most 0.8M)
MAX_ROWS = 1_000_000
#: Seconds past its limit HiGHS may take to return what it found before it is stopped.
GRACE_S = 1.0


class TooLarge(Declined):
    """The graph has more ops than the exact program takes."""


@dataclass
class ExactResult:
    schedule: Schedule
    optimal: bool  # proven optimal (within HiGHS's relative gap, 1e-4)
    gap: float  # (makespan - the solver's lower bound) / makespan
    lower_bound: float
    seconds: float
    from_solver: bool  # False: a list schedule was at least as good as the solver's best


class _Rows:
    """Sparse rows ``lower <= a . v <= upper``, built one at a time."""

    def __init__(self) -> None:
        self.r: list[int] = []
        self.c: list[int] = []
        self.v: list[float] = []
        self.lo: list[float] = []
        self.hi: list[float] = []

    def add(self, terms: list[tuple[int, float]], lo: float, hi: float) -> None:
        k = len(self.lo)
        for col, val in terms:
            self.r.append(k)
            self.c.append(col)
            self.v.append(val)
        self.lo.append(lo)
        self.hi.append(hi)

    def constraint(self, width: int) -> LinearConstraint:
        a = coo_matrix((self.v, (self.r, self.c)), shape=(len(self.lo), width)).tocsr()
        return LinearConstraint(a, np.array(self.lo), np.array(self.hi))


def _unordered_pairs(p: Problem, busy: list[bool]) -> list[tuple[int, int]]:
    """Pairs of ops that take time and that no path orders."""
    reach = [0] * p.n  # bitset of the ops reachable from i
    for i in reversed(p.topo):
        bits = 0
        for j, _ in p.succs[i]:
            bits |= reach[j] | (1 << j)
        reach[i] = bits
    ops = [i for i in range(p.n) if busy[i]]
    return [(i, k) for a, i in enumerate(ops) for k in ops[a + 1:]
            if not (reach[i] >> k) & 1 and not (reach[k] >> i) & 1]


def _identical(p: Problem) -> bool:
    D = p.num_devices
    same_w = all(len(set(row)) == 1 for row in p.w)
    links = {(p.intercept[a][b], p.slope[a][b], p.knee[a][b], p.extra[a][b])
             for a in range(D) for b in range(D) if a != b}
    return same_w and len(links) <= 1 and len({d.memory for d in p.devices}) == 1


def solve(p: Problem, time_limit: float | None = None) -> ExactResult:
    """The program above for ``p``, for at most ``time_limit`` seconds (default
    ``TIME_LIMIT_S``; building the program included, the solver given at least 1 s);
    raises ``TooLarge`` above ``MAX_OPS`` ops."""
    time_limit = TIME_LIMIT_S if time_limit is None else time_limit
    if p.n > MAX_OPS:
        raise TooLarge(f"the exact program takes graphs of at most {MAX_OPS} ops; this one has "
                       f"{p.n} (its rows grow with the square of the ops)")
    t0 = time.perf_counter()
    D, n = p.num_devices, p.n
    heuristic = _best_heuristic(p)
    U = heuristic.makespan
    groups = sorted(set(p.group))
    gidx = {g: k for k, g in enumerate(groups)}
    G = len(groups)
    busy = [max(row) > 0 for row in p.w]
    unit = U if U > 0 else 1.0  # times in units of U: microsecond ops stay above the tolerances
    w = [[t / unit for t in row] for row in p.w]

    def comm(e: int, a: int, b: int) -> float:
        return p.comm(e, a, b) / unit
    M = 1.0 + max((max(row) for row in w), default=0.0)

    def x(i: int, d: int) -> int:  # column of op i's group on device d
        return gidx[p.group[i]] * D + d
    s0, c_col = G * D, G * D + n
    width = c_col + 1
    dearest = [c / unit for c in p.max_comm()]  # per edge, the max of comm over pairs
    cross = [(i, j, e) for i in range(n) for j, e in p.succs[i] if p.group[i] != p.group[j]
             and dearest[e] > 0]
    q0 = width
    width += len(cross)
    pairs = _unordered_pairs(p, busy)
    edges = sum(len(s) for s in p.succs)
    size = G + D + len(cross) * D * (D - 1) + edges + n + 2 * len(pairs) * D
    if size > MAX_ROWS:
        raise TooLarge(f"the exact program over {D} devices would have about {size} rows "
                       f"(at most {MAX_ROWS}: one per cut edge and device pair, two per "
                       "unordered op pair and device)")
    o0 = width
    width += len(pairs)

    rows = _Rows()
    for g in range(G):
        rows.add([(g * D + d, 1.0) for d in range(D)], 1.0, 1.0)
    mem = [0.0] * G
    for i in range(n):
        mem[gidx[p.group[i]]] += p.mem[i]
    for d, dev in enumerate(p.devices):
        if np.isfinite(dev.memory) and any(mem):
            rows.add([(g * D + d, mem[g]) for g in range(G) if mem[g]], -np.inf, dev.memory)
    work = {i: [(x(i, d), -w[i][d]) for d in range(D) if w[i][d]] for i in range(n)}
    q_of = {}
    for k, (i, j, e) in enumerate(cross):
        q_of[(i, j)] = q0 + k
        for a in range(D):
            for b in range(D):
                c = comm(e, a, b)
                if a != b and c > 0:
                    rows.add([(x(i, a), c), (x(j, b), c), (q0 + k, -1.0)], -np.inf, c)
    for i in range(n):
        for j, _ in p.succs[i]:
            q = [(q_of[(i, j)], -1.0)] if (i, j) in q_of else []
            rows.add([(s0 + j, 1.0), (s0 + i, -1.0)] + work[i] + q, 0.0, np.inf)
        if not p.succs[i]:
            rows.add([(c_col, 1.0), (s0 + i, -1.0)] + work[i], 0.0, np.inf)
    for k, (i, j) in enumerate(pairs):
        o = o0 + k
        for d in range(D):
            both = [(x(i, d), -M), (x(j, d), -M)] if p.group[i] != p.group[j] else \
                [(x(i, d), -2 * M)]
            rows.add([(s0 + j, 1.0), (s0 + i, -1.0), (o, -M)] + both, w[i][d] - 3 * M, np.inf)
            rows.add([(s0 + i, 1.0), (s0 + j, -1.0), (o, M)] + both, w[j][d] - 2 * M, np.inf)

    lo, hi = np.zeros(width), np.full(width, 1.0)
    hi[q0:o0] = [dearest[e] for _, _, e in cross]
    integrality = np.zeros(width)
    integrality[:s0] = 1
    integrality[o0:] = 1
    if _identical(p):  # number the devices in the order groups first use them
        for g in range(min(G, D)):
            hi[g * D + g + 1:g * D + D] = 0.0
    cost = np.zeros(width)
    cost[c_col] = 1.0
    left = max(1.0, time_limit - (time.perf_counter() - t0))  # building counts too
    status, found, dual = _milp_within(left, cost, rows.constraint(width), integrality,
                                       Bounds(lo, hi))
    dual = 0.0 if dual is None or not np.isfinite(dual) else float(dual) * unit
    from_solver = False
    schedule = heuristic
    if found is not None:
        device = [int(np.argmax(found[x(i, 0):x(i, 0) + D])) for i in range(n)]
        start = found[s0:c_col]
        solved = baselines.timed(p, device, by_start(p, start))
        if solved.makespan < schedule.makespan - 1e-12:
            schedule, from_solver = solved, True
    span = schedule.makespan
    bound = min(max(dual, 0.0), span)
    gap = (span - bound) / span if span > 0 else 0.0
    optimal = status == 0 and gap <= 1e-3
    return ExactResult(schedule, optimal, 0.0 if optimal else gap, bound,
                       time.perf_counter() - t0, from_solver)


def _milp_within(seconds: float, cost: np.ndarray, rows: LinearConstraint,
                 integrality: np.ndarray, bounds: Bounds
                 ) -> tuple[int, np.ndarray | None, float | None]:
    """HiGHS on the program for at most ``seconds`` (and a second's grace): its status, best
    point and dual bound. HiGHS checks its time limit between phases, not within them (a
    294-op step over 16 devices ran 36 s past a 9.5 s limit), so it runs in a forked process
    that is stopped at the limit, with nothing found."""
    def run() -> tuple[int, np.ndarray | None, float | None]:
        res = milp(cost, constraints=rows, integrality=integrality, bounds=bounds,
                   options={"time_limit": seconds})
        return int(res.status), res.x, getattr(res, "mip_dual_bound", None)
    if "fork" not in mp.get_all_start_methods() or mp.current_process().daemon:
        return run()  # (a pool's worker may start no process)
    ctx = mp.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)

    def child() -> None:
        try:
            send.send(run())
        except Exception as e:  # noqa: BLE001 - raised again in the parent
            send.send(e)
    proc = ctx.Process(target=child, daemon=True)
    proc.start()
    send.close()  # the child's end: a child that dies unheard is an EOF here
    try:
        if receive.poll(seconds + GRACE_S):
            try:
                got = receive.recv()
            except EOFError:
                log.warning("exact: HiGHS's process ended with nothing found (exit code %s)",
                            proc.exitcode)
                return 1, None, None
            if isinstance(got, Exception):
                raise got
            return got  # type: ignore[no-any-return]
        log.info("exact: HiGHS stopped at its %.1f s limit with nothing found", seconds)
        return 1, None, None
    finally:
        proc.kill()
        proc.join()


def _best_heuristic(p: Problem) -> Schedule:
    """The fastest of the list schedulers' plans (one device, DPOS, HEFT, m-ETF), replayed:
    the incumbent the solver has to beat, and its makespan bounds the program's times."""
    plans = []
    for placer in (baselines.single, dpos, baselines.heft, baselines.m_etf):
        try:
            s = placer(p)
        except DoesNotFit:
            continue
        plans.append(baselines.timed(p, s.device, s.order()))
    if not plans:
        raise DoesNotFit("no list scheduler fits the graph in the devices' memory")
    return min(plans, key=lambda s: s.makespan)


def exact(p: Problem, time_limit: float | None = None) -> Schedule:
    """The exact strategy's schedule of ``p`` (``solve``), its gap logged."""
    r = solve(p, time_limit)
    how = "optimal" if r.optimal else f"within {100 * r.gap:.1f}% of HiGHS's bound"
    src = "" if r.from_solver else " (a list scheduler's plan: the solver found none better)"
    log.info("exact: %d ops on %d devices, %s, %.1f ms%s, in %.1f s", p.n, p.num_devices, how,
             1e3 * r.schedule.makespan, src, r.seconds)
    r.schedule.note = f"{how} ({1e3 * r.lower_bound:.3f} ms){src}, {r.seconds:.1f} s"
    return r.schedule
