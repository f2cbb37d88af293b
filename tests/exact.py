"""Brute-force references for small scheduling instances (tests only)."""
from __future__ import annotations

from fastt.sched import Problem


def optimal_makespan(p: Problem) -> float:
    """Optimal makespan with free transfers and unlimited memory (omega_opt of Theorem 1).

    Depth-first over semi-active schedules: ops appended to devices in order of (start time,
    index), each starting as early as its device and predecessors allow; pruned by the best
    makespan found and a critical-path lower bound. Needs positive op times.
    """
    n, D = p.n, p.num_devices
    wmin = [min(r) for r in p.w]
    tail = [0.0] * n  # shortest possible remaining path after op i (min costs, free transfers)
    for i in reversed(p.topo):
        tail[i] = max((wmin[j] + tail[j] for j, _ in p.succs[i]), default=0.0)
    best = [min(sum(p.w[i][d] for i in range(n)) for d in range(D))]
    finish = [0.0] * n
    done = [False] * n
    avail = [0.0] * D

    def dfs(count: int, last: tuple[float, int], span: float) -> None:
        if count == n:
            best[0] = min(best[0], span)
            return
        for i in range(n):
            if done[i] or not all(done[m] for m, _ in p.preds[i]):
                continue
            ready = max((finish[m] for m, _ in p.preds[i]), default=0.0)
            if ready + wmin[i] + tail[i] >= best[0] - 1e-12:
                continue
            for d in range(D):
                st = max(avail[d], ready)
                if (st, i) < last:
                    continue
                ft = st + p.w[i][d]
                if ft + tail[i] >= best[0] - 1e-12:
                    continue
                done[i], finish[i], old = True, ft, avail[d]
                avail[d] = ft
                dfs(count + 1, (st, i), max(span, ft))
                done[i], avail[d] = False, old

    dfs(0, (-1.0, -1), 0.0)
    return best[0]


def check_schedule(p: Problem, s) -> None:
    """Precedence with transfer times, no overlap on a device, memory, colocation."""
    for j in range(p.n):
        for m, e in p.preds[j]:
            arrive = s.finish[m] + p.comm(e, s.device[m], s.device[j])
            assert s.start[j] >= arrive - 1e-9, (m, j)
        assert abs(s.finish[j] - s.start[j] - p.w[j][s.device[j]]) < 1e-9
    for d in range(p.num_devices):
        ops = sorted((s.start[i], s.finish[i]) for i in range(p.n) if s.device[i] == d)
        for (a0, a1), (b0, b1) in zip(ops, ops[1:]):
            assert b0 >= a1 - 1e-9, (d, (a0, a1), (b0, b1))
        used = sum(p.mem[i] for i in range(p.n) if s.device[i] == d)
        assert used <= p.devices[d].memory + 1e-9
    for g, members in p.groups().items():
        assert len({s.device[i] for i in members}) == 1, g
