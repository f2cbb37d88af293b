"""The scheduling core: problems, placers (DPOS, OS-DPOS, baselines), the simulator.

Imports no TensorFlow.
"""
from fastt.sched.dpos import critical_path, dpos, rank_u
from fastt.sched.problem import CostSource, Device, ModelCosts, Problem
from fastt.sched.schedule import Schedule, Timeline

__all__ = ["CostSource", "Device", "ModelCosts", "Problem", "Schedule", "Timeline",
           "critical_path", "dpos", "rank_u"]
