"""The machine's load from other processes, in cores, over a window of steps (Linux
``/proc/stat``; elsewhere unknown). This process's own CPU time (all its threads) is left out,
so fastt's own graphs never count as load."""
from __future__ import annotations

import os
import time

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _busy_s() -> float | None:
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user)
    user, nice, system, _, _, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / _TICK


class Reading:
    """One instant: wall clock, the machine's busy CPU seconds, this process's CPU seconds."""

    def __init__(self) -> None:
        self.wall, self.busy, self.own = time.perf_counter(), _busy_s(), time.process_time()


MIN_WINDOW_S = 1.0  # /proc/stat counts in ticks (10 ms): shorter windows say little


def other_load(start: Reading, end: Reading) -> float | None:
    """Cores other processes kept busy between two readings (None where unknown, or when
    the readings are under ``MIN_WINDOW_S`` apart)."""
    wall = end.wall - start.wall
    if start.busy is None or end.busy is None or wall < MIN_WINDOW_S:
        return None
    return max(0.0, ((end.busy - start.busy) - (end.own - start.own)) / wall)
