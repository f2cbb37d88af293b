"""A scheduling instance compiled to integer indices: what every placer and the simulator read.

``Problem`` holds the DAG of n ops (data and control edges merged per op pair, bytes summed over
distinct tensors), the per-device compute costs ``w[i][d]``, the per-pair links
(``seconds = intercept + slope * bytes``, plus ``extra`` per byte past a ``knee``:
``fastt.costs.comm``), op memory and device capacities, and colocation
groups. While-loop back edges are dropped and each while frame becomes one colocation group, so
a loop is placed as one unit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from fastt import devices as devnames
from fastt.costs.comm import transfer_seconds
from fastt.costs.source import CostSource
from fastt.errors import FasttError
from fastt.ir import Graph, Op
from fastt.op_types import COLLECTIVE_TYPES
from fastt.sched.sim.rings import ring_order
from fastt.sched.sim.edges import Dag, graph_edges

TRANSFER_SCOPE = "fastt_transfers"  # the gates of ordered weight transfers (transfer_order)
TRANSFER_STREAM = 2  # the stream they run on


@dataclass(frozen=True, slots=True)
class Device:
    """A device to schedule on; ``memory`` in bytes (``math.inf`` = unlimited)."""
    name: str
    memory: float = math.inf

    @property
    def type(self) -> str:
        return devnames.device_type(self.name)


@dataclass
class Problem:
    names: list[str]
    devices: list[Device]
    w: list[list[float]]  # w[i][d]: seconds of op i on device d
    preds: list[list[tuple[int, int]]]  # preds[i] = [(m, edge id)]
    succs: list[list[tuple[int, int]]]  # succs[i] = [(j, edge id)]
    edge_bytes: list[float]
    intercept: list[list[float]]  # [d1][d2], 0 on the diagonal
    slope: list[list[float]]
    mem: list[float]
    group: list[int]  # colocation group id of each op (an op index)
    topo: list[int] = field(default_factory=list)
    # Per edge, the tensors it carries as (key, bytes): a tensor moves once to each device.
    edge_tensors: list[list[tuple[object, float]]] = field(default_factory=list)
    persistent: list[float] = field(default_factory=list)  # variables' bytes, per op
    # [d1][d2]: share of a d1 -> d2 transfer's bandwidth time (slope x bytes) the sender's
    # (receiver's) compute stream spends on it (0: a DMA engine or a NIC does the work; 1: the
    # cores copy every byte).
    send_cpu: list[list[float]] = field(default_factory=list)
    recv_cpu: list[list[float]] = field(default_factory=list)
    # [d1][d2]: the seconds a d1 -> d2 transfer takes from (sender, receiver) whatever its size
    # (gRPC's call), when the end moves other transfers and then when alone
    # (``sim_loops._InFlight``; from measured costs: the burst probed, alone the share of the
    # latency).
    call_cpu: list[list[tuple[float, float, float, float]]] = field(default_factory=list)
    # Per device: seconds a step pays to run anything there (a remote worker's call).
    reach: list[float] = field(default_factory=list)
    # Per device: how long, at most, a request for a tensor it holds waits for its busy cores
    # (gRPC between one-core workers: the scheduler's time slice; 0 where a NIC or spare
    # cores serve it; ``simulate.serve_from``).
    serve_delay: list[float] = field(default_factory=list)
    # Per device: the cores it computes on, as the index of the first device sharing them
    # (``shared_cores``); default: each device its own.
    cores: list[int] = field(default_factory=list)
    # Per op: the stream of its device it runs on (0: compute; 1: collectives, NCCL's own
    # stream, beside the compute stream; 2: the gates of ordered weight transfers,
    # ``fastt.sched.placers.transfer_order``); default: all 0.
    stream: list[int] = field(default_factory=list)
    # [d1][d2]: bytes past which a d1 -> d2 transfer costs ``extra`` more per byte (default:
    # none, infinite)
    knee: list[list[float]] = field(default_factory=list)
    extra: list[list[float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        n, D = len(self.names), len(self.devices)
        if D == 0:
            raise FasttError("no device to schedule on")
        if len(self.w) != n or any(len(r) != D for r in self.w):
            raise FasttError("compute cost matrix must be n ops x D devices")
        if not self.topo:
            self.topo = _topological(self.preds, self.succs)
        if not self.edge_tensors:
            self.edge_tensors = [[(("edge", e), b)] for e, b in enumerate(self.edge_bytes)]
        if not self.persistent:
            self.persistent = [0.0] * n
        if not self.stream:
            self.stream = [0] * n
        for name in ("send_cpu", "recv_cpu"):
            if not getattr(self, name):
                setattr(self, name, [[0.0] * D for _ in range(D)])
        if not self.call_cpu:
            self.call_cpu = [[(0.0,) * 4] * D for _ in range(D)]
        if not self.reach:
            self.reach = [0.0] * D
        if not self.serve_delay:
            self.serve_delay = [0.0] * D
        if not self.knee:
            self.knee = [[math.inf] * D for _ in range(D)]
        if not self.extra:
            self.extra = [[0.0] * D for _ in range(D)]
        if not self.cores:
            self.cores = list(range(D))
        self.index = {name: i for i, name in enumerate(self.names)}
        # per source device, the least bytes past which one of its links bends (hot loops
        # check it before they price a transfer as a line)
        self.least_knee = [min((k for k, x in zip(kr, xr) if x > 0), default=math.inf)
                           for kr, xr in zip(self.knee, self.extra)]

    @property
    def n(self) -> int:
        return len(self.names)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def capacity(self) -> list[float]:
        return [d.memory for d in self.devices]

    def comm(self, e: int, d1: int, d2: int) -> float:
        """Seconds to move edge ``e``'s tensors from device d1 to d2 (0 when d1 == d2)."""
        return self.transfer(d1, d2, self.edge_bytes[e])

    def transfer(self, d1: int, d2: int, nbytes: float) -> float:
        """Seconds to move ``nbytes`` from device d1 to d2 (0 when d1 == d2)."""
        if d1 == d2:
            return 0.0
        return transfer_seconds(self.intercept[d1][d2], self.slope[d1][d2], self.knee[d1][d2],
                                self.extra[d1][d2], nbytes)

    def hinged(self) -> bool:
        """Whether some link costs more per byte past a knee."""
        return min(self.least_knee, default=math.inf) < math.inf

    def max_comm(self) -> list[float]:
        """Per edge, the largest transfer time over device pairs (DPOS's ``c_ij``)."""
        D = self.num_devices
        if D < 2:
            return [0.0] * len(self.edge_bytes)
        links = {(self.intercept[a][b], self.slope[a][b],
                  self.knee[a][b] if self.extra[a][b] else math.inf, self.extra[a][b])
                 for a in range(D) for b in range(D) if a != b}
        # The max of the links' convex costs: only those not below another everywhere matter
        # (as dear at 0 bytes, per byte on both pieces, and bent no later); with one kind of
        # link (the usual case), one.
        kept = [k for k in links if not any(
            o != k and o[0] >= k[0] and o[1] >= k[1] and o[1] + o[3] >= k[1] + k[3]
            and o[2] <= k[2] for o in links)]
        if len(kept) == 1 and not kept[0][3]:  # one straight line: priced without calls
            i, s = kept[0][:2]
            return [i + s * nb for nb in self.edge_bytes]
        # several links (a DGX-1's NVLink pairs, PCIe, InfiniBand): priced as arrays, with
        # the operations of ``transfer_seconds`` in its order (the same floats)
        nb = np.asarray(self.edge_bytes, dtype=np.float64)
        out = np.full(len(nb), -np.inf)
        for intercept, slope, knee, extra in kept:
            t = intercept + slope * nb
            if extra:
                t = np.where(nb > knee, t + extra * (nb - knee), t)
            np.maximum(out, t, out=out)
        return out.tolist()

    def groups(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for i, g in enumerate(self.group):
            out.setdefault(g, []).append(i)
        return out

    @classmethod
    def build(cls, n: int, edges: Sequence[tuple], w: Sequence[Sequence[float]],
              devices: Sequence[Device], intercept: Sequence[Sequence[float]] | float = 0.0,
              slope: Sequence[Sequence[float]] | float = 0.0, mem: Sequence[float] | None = None,
              group: Sequence[int] | None = None, names: Sequence[str] | None = None,
              persistent: Sequence[float] | None = None,
              topo: Sequence[int] | None = None,
              send_cpu: Sequence[Sequence[float]] | float = 0.0,
              recv_cpu: Sequence[Sequence[float]] | float = 0.0,
              call_cpu: Sequence[Any] | None = None,
              reach: Sequence[float] | None = None,
              cores: Sequence[int] | None = None,
              stream: Sequence[int] | None = None,
              knee: Sequence[Sequence[float]] | float = math.inf,
              extra: Sequence[Sequence[float]] | float = 0.0,
              serve_delay: Sequence[float] | None = None) -> "Problem":
        """A problem from plain arrays: ``edges`` as (src, dst, bytes[, tensor key]); links as
        matrices or one value for every pair. Edges between the same two ops are merged; an
        edge without a key carries a tensor of its own, a key of None carries none (control)."""
        merged: dict[tuple[int, int], dict[object, float]] = {}
        for k, edge in enumerate(edges):
            pair = (edge[0], edge[1])
            key = edge[3] if len(edge) > 3 else ("edge", k)
            tensors = merged.get(pair)
            if tensors is None:
                tensors = merged[pair] = {}
            if key is not None:
                tensors[key] = edge[2]
        dag = Dag(n)
        dag.add((b, {a: tensors}) for (a, b), tensors in merged.items())
        return cls._assemble(dag, w, devices, intercept, slope, mem, group, names, persistent,
                             topo, send_cpu, recv_cpu, call_cpu, reach, cores, stream, knee,
                             extra, serve_delay)

    @classmethod
    def _assemble(cls, dag: "Dag", w: Sequence[Sequence[float]], devices: Sequence[Device],
                  intercept: Sequence[Sequence[float]] | float,
                  slope: Sequence[Sequence[float]] | float, mem: Sequence[float] | None,
                  group: Sequence[int] | None, names: Sequence[str] | None,
                  persistent: Sequence[float] | None, topo: Sequence[int] | None,
                  send_cpu: Sequence[Sequence[float]] | float,
                  recv_cpu: Sequence[Sequence[float]] | float, call_cpu: Sequence[Any] | None,
                  reach: Sequence[float] | None, cores: Sequence[int] | None,
                  stream: Sequence[int] | None,
                  knee: Sequence[Sequence[float]] | float = math.inf,
                  extra: Sequence[Sequence[float]] | float = 0.0,
                  serve_delay: Sequence[float] | None = None) -> "Problem":
        """``build``'s problem from its merged edges."""
        n, D = len(dag.preds), len(devices)
        preds, succs, edge_bytes, edge_tensors = dag.preds, dag.succs, dag.bytes, dag.tensors

        def square(v: Sequence[Sequence[float]] | float, diagonal: float = 0.0
                   ) -> list[list[float]]:
            if isinstance(v, (int, float)):
                return [[diagonal if a == b else float(v) for b in range(D)] for a in range(D)]
            return [[diagonal if a == b else float(v[a][b]) for b in range(D)]
                    for a in range(D)]

        return cls(names=list(names) if names is not None else [f"op{i}" for i in range(n)],
                   devices=list(devices), w=[list(map(float, r)) for r in w], preds=preds,
                   succs=succs, edge_bytes=edge_bytes, intercept=square(intercept),
                   slope=square(slope), mem=list(mem) if mem is not None else [0.0] * n,
                   group=list(group) if group is not None else list(range(n)),
                   edge_tensors=edge_tensors,
                   persistent=list(persistent) if persistent is not None else [0.0] * n,
                   topo=list(topo) if topo is not None else [],
                   send_cpu=square(send_cpu), recv_cpu=square(recv_cpu),
                   call_cpu=[[_four(call_cpu, a, b) for b in range(D)] for a in range(D)],
                   reach=list(map(float, reach)) if reach is not None else [],
                   cores=list(cores) if cores is not None else [],
                   stream=list(stream) if stream is not None else [],
                   knee=square(knee, math.inf), extra=square(extra),
                   serve_delay=list(map(float, serve_delay)) if serve_delay is not None else [])

    @classmethod
    def from_graph(cls, graph: Graph, devices: Sequence[Device], costs: CostSource,
                   mem: Mapping[str, float] | None = None,
                   persistent: Mapping[str, float] | None = None) -> "Problem":
        """Compile an IR graph with a cost source; ``mem`` maps op -> bytes it needs on its
        device (DPOS's memory check), ``persistent`` op -> variable bytes (default 0)."""
        names = graph.topological_order()
        index = {n: i for i, n in enumerate(names)}
        back = {op.name for op in graph if graph.is_back_edge_source(op.name)}
        ops = [graph[name] for name in names]
        dag = graph_edges(ops, index, back)
        devs = [d.name for d in devices]
        w = [costs.compute_row(n, devs) for n in names]
        links = [[(*costs.link(a, b), *costs.link_knee(a, b))
                  if a != b else (0.0, 0.0, math.inf, 0.0) for b in devs] for a in devs]
        stream = [0] * len(names)
        ring: list[int] | None = None  # the collectives' ring, found once per problem
        for i, name in enumerate(names):
            if graph[name].type in COLLECTIVE_TYPES:
                stream[i] = 1
                if ring is None:
                    ring = ring_order([[link[1] for link in row] for row in links])
                w[i] = _collective_seconds(graph[name], links, ring)
            elif graph[name].meta.split_of == TRANSFER_SCOPE:
                stream[i] = TRANSFER_STREAM
        # (send share, receive share[, send seconds, receive seconds of a call in a burst])
        cpu = [[(*costs.transfer_cpu(a, b), 0.0, 0.0)[:4] if a != b else (0.0,) * 4
                for b in devs] for a in devs]
        rep = graph.colocation_groups()
        joined: dict[str, str] = {}  # colocation group -> the group of its while frame

        def root(r: str) -> str:
            while r in joined:
                r = joined[r]
            return r

        for frame_ops in graph.while_frames().values():
            head = root(rep[frame_ops[0]])
            for o in frame_ops:
                r = root(rep[o])
                if r != head:
                    joined[r] = head
        group = [index[root(rep[n])] for n in names]
        mem = mem or {}
        return cls._assemble(
            dag, w, devices, intercept=[[lk[0] for lk in row] for row in links],
            slope=[[lk[1] for lk in row] for row in links],
            mem=[float(mem.get(n, 0.0)) for n in names], group=group, names=names,
            persistent=[float((persistent or {}).get(n, 0.0)) for n in names],
            topo=list(range(len(names))), send_cpu=[[c[0] for c in row] for row in cpu],
            recv_cpu=[[c[1] for c in row] for row in cpu],
            call_cpu=[[_calls(c, lk[0]) for c, lk in zip(row, lrow)]
                      for row, lrow in zip(cpu, links)],
            reach=[costs.device_step(d) for d in devs], cores=shared_cores(devs),
            stream=stream, knee=[[lk[2] for lk in row] for row in links],
            extra=[[lk[3] for lk in row] for row in links],
            serve_delay=[costs.serve_delay(d) for d in devs])


def _four(call_cpu: Sequence[Any] | None, a: int, b: int) -> tuple[float, float, float, float]:
    """Pair (a, b)'s ``Problem.call_cpu`` from ``build``'s: one for every pair, or a matrix."""
    if a == b or not call_cpu:
        return (0.0, 0.0, 0.0, 0.0)
    v = call_cpu if isinstance(call_cpu[0], (int, float)) else call_cpu[a][b]
    return (float(v[0]), float(v[1]), float(v[2]), float(v[3]))


def _calls(cpu: tuple[float, ...], latency: float) -> tuple[float, float, float, float]:
    """A pair's ``Problem.call_cpu`` from its (send share, receive share, send seconds,
    receive seconds in a burst): alone, a call takes each end its share of the latency;
    unmeasured seconds in a burst are those alone."""
    lone = (cpu[0] * latency, cpu[1] * latency)
    burst = cpu[2:4] if any(cpu[2:4]) else lone
    return (burst[0], burst[1], lone[0], lone[1])


def _collective_seconds(op: Op, links: list[list[tuple[float, float, float, float]]],
                        ring: list[int]) -> list[float]:
    """A ring all-reduce of ``op``'s tensor over ``num_devices`` devices, on each device:
    2(n-1) steps, each moving 1/n of the bytes to the next device of the ring
    (``ring``: the devices in ``ring_order``, over the fastest links) in lockstep, so at the
    pace of the ring's slowest link ((intercept, slope, knee, extra))."""
    n, D = int(op.attrs.get("num_devices", 2)), len(links)
    nbytes = float(op.outputs[0].nbytes or 0) if op.outputs else 0.0
    if D < 2:
        return [0.0] * D
    step = max(transfer_seconds(*links[a][b], nbytes / n)
               for a, b in zip(ring, ring[1:] + ring[:1]))
    return [2 * (n - 1) * step] * D


def _topological(preds: list[list[tuple[int, int]]],
                 succs: list[list[tuple[int, int]]]) -> list[int]:
    """Kahn's algorithm on op indices (not networkx: problems are compiled in OS-DPOS's
    search loop, and a DiGraph of ints would be built for every candidate)."""
    indeg = [len(p) for p in preds]
    ready = [i for i, d in enumerate(indeg) if d == 0]
    order: list[int] = []
    while ready:
        i = ready.pop()
        order.append(i)
        for j, _ in succs[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    if len(order) != len(preds):
        raise FasttError("the op graph has a cycle; cannot schedule it")
    return order


def shared_cores(names: Sequence[str]) -> list[int]:
    """Per device name, the index of the first device computing on the same cores: the CPU
    devices of one process share its cores and its inter-op thread pool (logical CPU devices
    give no parallelism of their own); GPUs and other processes' devices have their own.
    Names that are not device names have their own."""
    out = []
    for k, name in enumerate(names):
        first = k
        try:
            if devnames.device_type(name) == "CPU":
                first = next(j for j, other in enumerate(names[:k])
                             if devnames.device_type(other) == "CPU"
                             and devnames.same_process(name, other))
        except (StopIteration, FasttError):
            first = k
        out.append(first)
    return out
