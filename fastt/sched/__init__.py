"""The scheduling core: problems, placers (DPOS, OS-DPOS, baselines), the simulator.

Imports no TensorFlow.
"""
from fastt.costs.source import CostSource
from fastt.sched.dpos import critical_path, dpos, rank_u
from fastt.sched.problem import Device, Problem
from fastt.sched.schedule import Schedule, Timeline

__all__ = ["CostSource", "Device", "Problem", "Schedule", "Timeline",
           "critical_path", "dpos", "rank_u"]
