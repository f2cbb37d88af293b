"""The scheduling core, in three rooms and the strategies over them.

- ``fastt.sched.sim``: the compiled problem, schedules, device sets and the simulator;
- ``fastt.sched.placers``: DPOS, the baselines, PipeDream and the exact MILP;
- ``fastt.sched.search``: the starting graphs, OS-DPOS's split search and the bounds;
- here: ``registry`` (every strategy by name), ``strategy`` (``plan()`` and the ``Strategy``
  document) and ``serial`` (a strategy as JSON).

The graph rewrites the placers start from are ``fastt.passes``. Imports no TensorFlow.
"""
from fastt.costs.source import CostSource
from fastt.sched.placers.dpos import critical_path, dpos, rank_u
from fastt.sched.sim.problem import Device, Problem
from fastt.sched.sim.schedule import Schedule, Timeline

__all__ = ["CostSource", "Device", "Problem", "Schedule", "Timeline",
           "critical_path", "dpos", "rank_u"]
