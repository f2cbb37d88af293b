"""Whether data parallelism fits the devices' memory: the data-parallel graph's peak of live
bytes per device, its ops replayed in topological order a unit of time each (and the same
peak for the whole graph on one device)."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

from fastt.costs.memory import MemoryModel
from fastt.costs.source import CostSource
from fastt.devices import same_process
from fastt.ir import Graph
from fastt.sched.placers import baselines
from fastt.passes.allreduce import BUCKET_BYTES, all_reduce
from fastt.passes.data_parallel import data_parallel
from fastt.sched.sim.problem import Device, Problem
from fastt.sched.sim.simulate import simulate


def peak_memory_one_device(graph: Graph) -> float:
    """Bytes the graph needs on one device: variables plus the peak of live outputs when its
    ops run one after another in topological order (a unit of time each). Outputs of
    aliasing ops (Identity, ReadVariableOp...) are counted too: an over-estimate."""
    p = one_device_problem(graph)
    return simulate(p, [0] * p.n, [p.topo]).peak_memory[0]


def one_device_problem(graph: Graph) -> Problem:
    """The graph compiled for ``peak_memory_one_device``: on one device, a unit of time an
    op, its variables' bytes persistent."""
    mem = MemoryModel.from_graph(graph)
    dev = [Device("/job:localhost/replica:0/task:0/device:CPU:0")]
    return Problem.from_graph(graph, dev, _UnitCosts(), persistent=mem.persistent)


class _UnitCosts(CostSource):
    def compute(self, op: str, device: str) -> float:
        return 1.0

    def link(self, src: str, dst: str) -> tuple[float, float]:
        return (0.0, 0.0)


def unit_costs(p: Problem) -> Problem:
    """``p`` with every op a unit of time (a collective none, as ``_UnitCosts`` compiles it:
    its ring over free links) and free links: the same problem ``Problem.from_graph`` makes of
    the graph with ``_UnitCosts``, without compiling it again."""
    D = p.num_devices
    zero = [[0.0] * D for _ in range(D)]
    return dataclasses.replace(
        p, w=[[0.0 if s == 1 else 1.0] * D for s in p.stream], intercept=zero, slope=zero,
        extra=zero, send_cpu=zero, recv_cpu=zero, reach=[0.0] * D, mem=[0.0] * p.n)


def nccl(devices: Sequence[Device]) -> bool:
    """Whether the all-reduce over ``devices`` is NCCL's: GPUs, all in one process."""
    return all(d.type == "GPU" and same_process(d.name, devices[0].name) for d in devices)


def data_parallel_fitting(graph: Graph, devices: Sequence[Device], ring: bool = True,
                          bucket_bytes: float = BUCKET_BYTES, replicas: Graph | None = None,
                          compile_graph: Callable[[Graph], Problem] | None = None
                          ) -> Graph | None:
    """The data-parallel graph over ``devices`` when every device holds its replica (each
    with its share of the batch; with ``ring``, mirrored variables and ring all-reduce, else
    gradients summed on device 0; ``bucket_bytes``: the all-reduce's fusion buckets), else
    None. ``replicas``: ``data_parallel(graph, len(devices))`` when the caller has it. Memory
    is the simulated peak of the replicas' placement, ops in topological order, a unit of
    time each; ``compile_graph``: the caller's compiler (``osdpos.compiler``), whose problem
    is replayed in those units instead of compiling the graph again."""
    D = len(devices)
    dp = replicas if replicas is not None else data_parallel(graph, D)
    if ring:
        dp = all_reduce(dp, D, bucket_bytes, collective=nccl(devices))
    if all(d.memory == math.inf for d in devices):
        return dp
    if compile_graph is not None:
        p = unit_costs(compile_graph(dp))
    else:
        mem = MemoryModel.from_graph(dp)
        p = Problem.from_graph(dp, devices, _UnitCosts(), persistent=mem.persistent)
    device = baselines.replica_devices(p, dp)
    orders: list[list[int]] = [[] for _ in range(D)]
    for i in p.topo:  # as peak_memory_one_device: each device in topological order
        orders[device[i]].append(i)
    peaks = simulate(p, device, orders).peak_memory
    return dp if all(m <= d.memory for m, d in zip(peaks, devices)) else None
