"""Memory of a training step: the peak of live bytes of the whole graph on one device, its ops
in the order TensorFlow's executor runs them, reads of variables sharing the variable's buffer;
and whether data parallelism fits the devices (the data-parallel graph's peak per device, its
ops replayed in topological order a unit of time each)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

from fastt.costs import bfc
from fastt.costs.memory import MemoryModel
from fastt.costs.source import CostSource
from fastt.devices import same_process
from fastt.ir import Graph, writes_variable
from fastt.op_types import INLINE_TYPES, READS, SPARSE_ACCESS_PREFIXES
from fastt.sched.placers import baselines
from fastt.errors import DoesNotFit
from fastt.passes.accumulate import accumulate
from fastt.passes.allreduce import BUCKET_BYTES, all_reduce
from fastt.passes.data_parallel import batch_size, data_parallel
from fastt.sched.sim.problem import Device, Problem
from fastt.sched.sim.schedule import executor_order
from fastt.sched.sim.sim_loops import needs_of
from fastt.sched.sim.simulate import simulate


def peak_memory_one_device(graph: Graph, gpu: bool = False) -> float:
    """Bytes TensorFlow's BFC allocator holds at the peak of the graph's steps on one device
    (``fastt.costs.bfc``): its variables, then its outputs as they live when its ops run one
    at a time in the order TensorFlow's executor runs them (``executor_order``; on a GPU every
    kernel is inexpensive, so ops run in the order they become ready). A read of a variable
    shares the variable's buffer, and a variable in copy-on-read mode gets a new buffer at
    each write (``variable_access``). Other aliasing ops (Identity,
    Reshape...) are counted as copies: an over-estimate while both are live."""
    p = one_device_problem(graph)
    order = executor_order(p, [gpu or graph[n].type in INLINE_TYPES for n in p.names])
    access = variable_access(graph, p)
    pos = {i: k for k, i in enumerate(order)}
    swaps = sorted((pos[w], var) for w, var in access.copies.items())
    return float(bfc.peak_bytes_in_use(p.persistent, live_tensors(p, order, access), swaps))


@dataclass
class VariableAccess:
    """How a step's ops use its variables' buffers (``variable_access``): ``views``, each read
    that shares its variable's buffer -> the writes of that variable; ``copies``, each write
    that gives its variable a new buffer -> the variable."""
    views: dict[int, list[int]] = field(default_factory=dict)
    copies: dict[int, int] = field(default_factory=dict)


def variable_access(graph: Graph, p: Problem) -> VariableAccess:
    """The reads and writes of variables among the ops of ``p``. A read (``ReadVariableOp``,
    or the Identity of a reference variable) shares the variable's buffer; a write that runs
    while the read is still needed copies the variable first (copy on write), leaving the old
    buffer to the read. A variable the step accesses sparsely (an embedding's gather) is in
    copy-on-read mode: its reads are copies (not views), and each dense write of it allocates
    a new buffer while the old one is still held."""
    writers: dict[str, list[int]] = {}
    sparse: set[str] = set()  # variables in copy-on-read mode
    for i, name in enumerate(p.names):
        op = graph[name]
        if writes_variable(op):
            for r in op.inputs:
                writers.setdefault(r.op, []).append(i)
        if op.type.startswith(SPARSE_ACCESS_PREFIXES) and op.inputs:
            sparse.add(op.inputs[0].op)
    out = VariableAccess()
    for i, name in enumerate(p.names):
        op = graph[name]
        var = op.inputs[0].op if op.inputs else None
        if var is None or var not in graph or not graph[var].is_variable:
            continue
        if op.type in READS and var not in sparse:
            out.views[i] = writers.get(var, [])
        elif var in sparse and writes_variable(op) and var in p.index and \
                not op.type.startswith(SPARSE_ACCESS_PREFIXES):
            out.copies[i] = p.index[var]
    return out


def live_tensors(p: Problem, order: Sequence[int], access: VariableAccess | None = None
                 ) -> list[tuple[int, int, float]]:
    """The buffers of ``p`` that hold bytes when its ops run one at a time in ``order`` on one
    device, as (begin, end, bytes) in positions of ``order``: each output from its producer
    until its last consumer is done (``simulate``'s rule, a unit of time an op). With
    ``access``, a read that views its variable holds bytes of its own only from the first
    write of the variable that runs while it is needed (a copy on write). O(n + e)."""
    views = access.views if access else {}
    pos = [0] * p.n
    for k, i in enumerate(order):
        pos[i] = k
    made: dict[object, tuple[int, float]] = {}
    last: dict[object, int] = {}
    for j, needs in enumerate(needs_of(p)):
        for m, key, nbytes in needs:
            if nbytes > 0:
                made.setdefault(key, (m, nbytes))
                last[key] = max(last.get(key, 0), pos[j])
    out = []
    for key, (m, nbytes) in made.items():
        begin, end = pos[m], last[key] + 1
        if m in views:
            writes = [pos[w] for w in views[m] if begin < pos[w] < end]
            if not writes:
                continue
            begin = min(writes)
        out.append((begin, end, nbytes))
    return out


def peak_in_order(p: Problem, order: Sequence[int], access: VariableAccess | None = None
                  ) -> float:
    """The peak of live bytes on one device when the ops of ``p`` run one at a time in
    ``order``: the persistent bytes plus the most bytes of ``live_tensors`` at once (frees
    before allocations at the same time). O(n + e + t log t) for t tensors."""
    events = sorted(e for b, f, nbytes in live_tensors(p, order, access)
                    for e in ((b, 1, nbytes), (f, 0, -nbytes)))
    live = peak = 0.0
    for _, _, delta in events:
        live += delta
        peak = max(peak, live)
    return sum(p.persistent) + peak


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
    is ``data_parallel_peaks``'; ``compile_graph``: the caller's compiler
    (``osdpos.compiler``), whose problem is replayed in those units instead of compiling the
    graph again."""
    dp, peaks = data_parallel_peaks(graph, devices, ring, bucket_bytes, replicas,
                                    compile_graph)
    return dp if all(m <= d.memory for m, d in zip(peaks, devices)) else None


def data_parallel_peaks(graph: Graph, devices: Sequence[Device], ring: bool = True,
                        bucket_bytes: float = BUCKET_BYTES, replicas: Graph | None = None,
                        compile_graph: Callable[[Graph], Problem] | None = None
                        ) -> tuple[Graph, list[float]]:
    """The data-parallel graph over ``devices`` (see ``data_parallel_fitting``) and its peak
    of live bytes on each device: the simulated peak of the replicas' placement, ops in
    topological order, a unit of time each (zeros, not simulated, where every device is
    unbounded)."""
    D = len(devices)
    dp = replicas if replicas is not None else data_parallel(graph, D)
    if ring:
        dp = all_reduce(dp, D, bucket_bytes, collective=nccl(devices))
    if all(d.memory == math.inf for d in devices):
        return dp, [0.0] * D
    if compile_graph is not None:
        p = unit_costs(compile_graph(dp))
    else:
        mem = MemoryModel.from_graph(dp)
        p = Problem.from_graph(dp, devices, _UnitCosts(), persistent=mem.persistent)
    device = baselines.replica_devices(p, dp)
    orders: list[list[int]] = [[] for _ in range(D)]
    for i in p.topo:  # each device in topological order
        orders[device[i]].append(i)
    return dp, simulate(p, device, orders).peak_memory


#: The micro-batch counts gradient accumulation is tried with, fewest first
FITTED = "memory-fit"  # the name of a plan that runs a step fitted into its device's memory
MICRO_BATCH_COUNTS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
ACCUMULATED_OPS = 2_000_000  # the largest accumulated graph built


@dataclass
class Accumulation:
    """A graph whose batch runs as ``micro_batches`` micro-batches in turn (``accumulate``),
    and its peak on one device (bytes, ``peak_memory_one_device``)."""
    micro_batches: int
    graph: Graph
    peak: float


def accumulation_fitting(graph: Graph, limit: float, gpu: bool = False) -> Accumulation:
    """The fewest micro-batches (of ``MICRO_BATCH_COUNTS``, at most the batch) whose
    accumulated graph holds at most ``limit`` bytes on one device; ``DoesNotFit`` saying
    the least any held, and by how much it is over, when none does (``Declined`` when the
    graph cannot run in micro-batches). The peak falls with the micro-batches until the
    variables and their gradients dominate: the search stops there. O(sum of the tried
    graphs' sizes)."""
    B = batch_size(graph)
    best: Accumulation | None = None
    for m in MICRO_BATCH_COUNTS:
        if m > B or m * len(graph) > ACCUMULATED_OPS:
            break
        g = accumulate(graph, m)
        tried = Accumulation(m, g, peak_memory_one_device(g, gpu))
        if tried.peak <= limit:
            return tried
        if best is not None and tried.peak > 0.98 * best.peak:
            break  # no longer falling
        best = tried if best is None or tried.peak < best.peak else best
    least = "" if best is None else (
        f"; the least, {best.peak / 2 ** 20:.1f} MiB in {best.micro_batches} micro-batches, "
        f"is {(best.peak - limit) / 2 ** 20:.1f} MiB over")
    raise DoesNotFit(f"no gradient accumulation fits {limit / 2 ** 20:.1f} MiB{least}")
