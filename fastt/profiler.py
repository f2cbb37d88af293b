"""Turn a TensorFlow ``RunMetadata`` into cost samples attributed to the user's ops.

TensorFlow does not run the user's graph as written: grappler folds constants
(``ConstantFolding/...``), fuses kernels (``Relu_1 = _MklNativeFusedConv2D(...)`` stands for a
Conv2D, a BiasAdd and a Relu), and the partitioner adds transfer and bookkeeping nodes
(``X/_41``, ``.../ctrl/_38``, ``_arg_x_0_0``, ``_retval_loss_0_0``). ``profile`` maps every node
it can back to a user op, shares a fused kernel's time between the ops it absorbed (by their
analytical work), turns transfer nodes and cross-process ``RecvTensor`` entries into transfer
samples, and reports the coverage: the share of measured compute time attributed to user ops.

Ops that overlap on one device share it: a CPU device's inter-op threads run several kernels at
once on the same cores, and each kernel's own start-to-end time then counts the others' work
too (AlexNet on one core: 450 ms of kernel time in a 285 ms step). The simulator runs a device's
ops one at a time, so each op is charged its share of the device (processor sharing: ``dt / n``
while ``n`` ops run), and a device's charges add up to the time it was busy. Where moving a
tensor between processes takes the cores of its two ends (gRPC; ``transfer_cpu``), the
transfer shares them too: the simulator charges its share to both ends itself, so the kernels
it overlapped are charged without it (a data-parallel VGG's half-batch ``Relu`` traced at
12-16 ms beside a 64 MiB weight transfer on a one-core worker). What is taken is what the
simulator charges back (its share of the bytes' modeled time and its call), spread over the
time the transfer was traced: in a step, transfers are traced up to five times slower than
the link probe moves the same bytes, and their share over that whole time would take from
the kernels more than the cores gave the bytes.

The RunMetadata is read by attribute (it is a protobuf), so this module imports no TensorFlow.
"""
from __future__ import annotations

import re
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

from fastt import devices
from fastt.errors import ProfileError
from fastt.ir import Graph, TensorRef
from fastt.ir.flops import flops
from fastt.ir.fused import absorbed_ops
from fastt.op_types import IGNORED_NODES, TRANSFER_TYPES
from fastt.sharing import processor_sharing

#: TensorFlow has one profiler per process: a traced run while another is traced fails
#: ("Another profiling session active"), so every traced run of fastt holds this.
TRACING = threading.RLock()

# (src, dst, bytes, traced seconds) -> the (send, recv) share of the cores it took meanwhile
TransferCpu = Callable[[str, str, float, float], tuple[float, float]]

_LABEL_PREFIX = re.compile(r"^(?:\[[^\]]*\]\s*)+")
_LABEL = re.compile(r"^(?P<name>\S+) = (?P<type>[\w.>-]+)\((?P<args>.*)\)\s*$")
_RECV_TENSOR = re.compile(r"edge_\d+_(?P<tensor>\S+) from (?P<src>\S+) to (?P<dst>\S+)")
_ARG = re.compile(r"^_arg_(?P<name>.+)_\d+_\d+$")
_RETVAL = re.compile(r"^_retval_(?P<name>.+)_\d+_\d+$")
_TRANSFER_SUFFIX = re.compile(r"^(?P<base>.+)/_\d+$")


@dataclass(frozen=True, slots=True)
class ComputeSample:
    """``seconds`` of compute of user op ``op`` on ``device`` in one step."""
    op: str
    device: str
    seconds: float


@dataclass(frozen=True, slots=True)
class TransferSample:
    """One tensor of ``nbytes`` moved from ``src`` to ``dst`` in ``seconds``."""
    src: str
    dst: str
    nbytes: int
    seconds: float
    tensor: str = ""


@dataclass
class Profile:
    """What one profiled step says about the user's graph."""
    compute: list[ComputeSample] = field(default_factory=list)
    transfers: list[TransferSample] = field(default_factory=list)
    placement: dict[str, str] = field(default_factory=dict)  # user op -> device it ran on
    output_shapes: dict[TensorRef, tuple[int, ...]] = field(default_factory=dict)
    output_bytes: dict[TensorRef, int] = field(default_factory=dict)
    fused: dict[str, list[str]] = field(default_factory=dict)  # kernel op -> ops it absorbed
    unmapped: dict[str, float] = field(default_factory=dict)  # stats node -> seconds
    total_compute_s: float = 0.0
    kernel_s: dict[str, float] = field(default_factory=dict)  # device -> sum of kernel times
    busy_s: dict[str, float] = field(default_factory=dict)  # device -> time a kernel ran
    span_s: float = 0.0  # first kernel start to last kernel end, over all devices
    untraced_s: float | None = None  # the same graph's step time without tracing
    scale: float = 1.0  # applied to the kernels' times: the untraced step over the span, <= 1

    @property
    def overhead_s(self) -> float | None:
        """What an untraced step takes beyond what a replay of its kernels covers: the call,
        feeds and fetches, the executors' start and end, and where the step ran on one device
        with nothing to wait for but its own executor, the idle gaps between its kernels
        (dispatching each op: a replay runs an op as soon as its inputs are there). Elsewhere
        idle time within the span is waiting for other devices, which the replay models. None
        unless the untraced step time is known."""
        if self.untraced_s is None or self.span_s <= 0:
            return None
        if len(self.busy_s) == 1 and not any(t.src != t.dst for t in self.transfers):
            busy = next(iter(self.busy_s.values()))
            return max(self.untraced_s - busy * self.scale, 0.0)
        return max(self.untraced_s - self.span_s, 0.0)

    @property
    def concurrency(self) -> dict[str, float]:
        """Per device, kernel time over busy time: how many kernels ran at once on average."""
        return {d: k / self.busy_s[d] for d, k in self.kernel_s.items() if self.busy_s.get(d)}

    @property
    def attributed_s(self) -> float:
        return sum(s.seconds for s in self.compute)

    @property
    def coverage(self) -> float:
        """Share of measured compute time attributed to user ops (1.0 when nothing ran)."""
        return 1.0 if self.total_compute_s <= 0 else self.attributed_s / self.total_compute_s


class _NameMapper:
    """Maps node names found in step stats back to user op names."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._cache: dict[str, str | None] = {}

    def __call__(self, node: str) -> str | None:
        if node not in self._cache:
            self._cache[node] = self._resolve(node)
        return self._cache[node]

    def _resolve(self, node: str) -> str | None:
        if node in self.graph:
            return node
        for pattern in (_ARG, _RETVAL):
            m = pattern.match(node)
            if m and m.group("name") in self.graph:
                return m.group("name")
        parts = node.split("/")
        # Grappler prefixes a rewritten node with its optimizer's name ("ConstantFolding/",
        # "GroupCrossDeviceControlEdges_0/"): try without up to two leading components.
        for drop in range(min(3, len(parts))):
            hit = self._longest_prefix(parts[drop:])
            if hit is not None:
                return hit
        return None

    def _longest_prefix(self, parts: list[str]) -> str | None:
        for end in range(len(parts), 0, -1):
            candidate = "/".join(parts[:end])
            if candidate in self.graph:
                return candidate
            # "ShapeN-matshapes-1", "ConcatOffset-folded-2": a rewrite suffix on the last part.
            base = candidate.split("-", 1)[0]
            if base != candidate and base in self.graph:
                return base
        return None


def _seconds(ns: Any) -> float:
    if getattr(ns, "op_end_rel_nanos", 0) > 0:
        return max(ns.op_end_rel_nanos - ns.op_start_rel_nanos, 0) / 1e9
    if ns.op_end_rel_micros > 0:
        return max(ns.op_end_rel_micros - ns.op_start_rel_micros, 0) / 1e6
    return ns.all_end_rel_micros / 1e6


def _wall_seconds(ns: Any) -> float:
    nanos = getattr(ns, "all_end_rel_nanos", 0)
    return nanos / 1e9 if nanos > 0 else ns.all_end_rel_micros / 1e6


def node_label(ns: Any) -> tuple[str, list[str]]:
    """(kernel type, input names) from a node's timeline label."""
    m = _LABEL.match(_LABEL_PREFIX.sub("", ns.timeline_label))
    if not m:
        return "", []
    args = [a.strip() for a in m.group("args").split(",") if a.strip()]
    return m.group("type"), args


def _output_bytes(ns: Any) -> int:
    return sum(o.tensor_description.allocation_description.requested_bytes for o in ns.output)


def profile(run_metadata: Any, graph: Graph, untraced_s: float | None = None,
            transfer_cpu: TransferCpu | None = None) -> Profile:
    """Read one step's ``RunMetadata`` (a protobuf, read by attribute) against ``graph``.

    ``untraced_s``, the same graph's step time when not traced (a median of steady steps),
    calibrates the profile: tracing adds its own work to a step (on a 1,600-op LSTM a traced
    step took 35 ms where an untraced one took 26, its kernels spanning 28), so where the
    kernels' span exceeds the untraced step their times are scaled down to fit it, and what
    the untraced step takes beyond its kernels is the step's overhead (``Profile.overhead_s``).
    ``transfer_cpu(src, dst, bytes, seconds)``, the (sender, receiver) share of their cores
    that a cross-process transfer traced over ``seconds`` took (``CommCostModel.background``),
    takes that share from the kernels the transfer overlapped on each end."""
    step_stats = getattr(run_metadata, "step_stats", None)
    if step_stats is None or not hasattr(step_stats, "dev_stats"):
        raise ProfileError("not a RunMetadata: it has no step_stats.dev_stats "
                           "(was the step run with RunOptions(trace_level=FULL_TRACE)?)")
    mapper = _NameMapper(graph)
    out = Profile(untraced_s=untraced_s)
    kernel_time: dict[tuple[str, str], float] = defaultdict(float)
    kernel_type: dict[str, str] = {}
    pending_transfers: list[tuple[str, str, Any]] = []  # (user op, dst device, node stats)
    produced: dict[tuple[str, str], float | None] = {}  # (device, node) -> its end (epoch s)
    recvs: list[Any] = []
    kernels: list[tuple[str, str, str | None, Any]] = []  # (device, node, user op, stats)
    ktypes: list[str] = []

    for dev in step_stats.dev_stats:
        device = devices.canonical(dev.device)
        for ns in dev.node_stats:
            name = ns.node_name
            if name in IGNORED_NODES:
                continue
            produced[(device, name)] = _absolute_end(ns)
            if name == "RecvTensor":
                recvs.append(ns)
                continue
            ktype, args = node_label(ns)
            base = _TRANSFER_SUFFIX.match(name)
            is_transfer = ktype in TRANSFER_TYPES or (
                base is not None and name not in graph and ktype == "Identity"
                and bool(args) and _TRANSFER_SUFFIX.match(args[0]) is not None)
            user = mapper(base.group("base") if is_transfer and base else name)
            if is_transfer:
                if user is not None:
                    pending_transfers.append((user, device, ns))
                continue
            kernels.append((device, name, user, ns))
            ktypes.append(ktype)
    background: dict[str, list[tuple[int, int, float]]] = defaultdict(list)
    for ns in recvs:
        for sample, span in _recv_tensor_sample(ns, produced):
            out.transfers.append(sample)
            shares_of = transfer_cpu(sample.src, sample.dst, sample.nbytes, sample.seconds) \
                if transfer_cpu else (0.0, 0.0)
            for device, share in zip((sample.src, sample.dst), shares_of):
                if span is not None and share > 0:
                    background[device].append((*span, share))
    shares = _device_shares(kernels, out, background)
    if untraced_s is not None and untraced_s > 0 and out.span_s > untraced_s:
        out.scale = untraced_s / out.span_s
        shares = [v * out.scale for v in shares]
    for (device, name, user, ns), ktype, seconds in zip(kernels, ktypes, shares):
        out.total_compute_s += seconds
        if user is None:
            out.unmapped[name] = out.unmapped.get(name, 0.0) + seconds
            continue
        kernel_time[(user, device)] += seconds
        if name == user:
            out.placement[user] = device
            kernel_type[user] = ktype
            _record_outputs(out, graph, user, ns)
        else:
            out.placement.setdefault(user, device)

    absorbed = absorbed_ops(graph, kernel_type, out.placement)
    for (user, device), seconds in kernel_time.items():
        members = absorbed.get(user)
        if not members:
            out.compute.append(ComputeSample(user, device, seconds))
            continue
        out.fused[user] = members
        group = [user] + members
        weights = [flops(graph[m], graph) for m in group]
        total = sum(weights)
        for m, w in zip(group, weights):
            out.compute.append(ComputeSample(m, device, seconds * w / total))
            out.placement.setdefault(m, device)
    # A join fastt added carries the name of the op it joins: its time is not that op's.
    out.compute = [s for s in out.compute if graph[s.op].meta.join is None]

    for user, dst, ns in pending_transfers:
        src = out.placement.get(user)
        if src is None or src == dst:
            continue
        nbytes = _output_bytes(ns) or (graph.tensor(TensorRef(user, 0)).nbytes or 0
                                       if graph[user].outputs else 0)
        out.transfers.append(TransferSample(src, dst, nbytes, _wall_seconds(ns), user))
    return out


def _record_outputs(out: Profile, graph: Graph, user: str, ns: Any) -> None:
    op = graph[user]
    for o in ns.output:
        if not 0 <= o.slot < len(op.outputs):
            continue
        td = o.tensor_description
        ref = TensorRef(user, o.slot)
        if not td.shape.unknown_rank and td.shape.dim:
            out.output_shapes[ref] = tuple(int(d.size) for d in td.shape.dim)
        elif not td.shape.unknown_rank and td.HasField("shape"):
            out.output_shapes[ref] = ()
        req = td.allocation_description.requested_bytes
        if req > 0:
            out.output_bytes[ref] = int(req)


def _kernel_span(ns: Any) -> tuple[int, int] | None:
    """A kernel's (start, end) in nanoseconds since the epoch; None without absolute times."""
    base = getattr(ns, "all_start_nanos", 0) or 1000 * getattr(ns, "all_start_micros", 0)
    if not base:
        return None
    if getattr(ns, "op_end_rel_nanos", 0) > 0:
        return base + ns.op_start_rel_nanos, base + max(ns.op_end_rel_nanos,
                                                         ns.op_start_rel_nanos)
    return base, base + int(1e9 * _seconds(ns))


def _device_shares(kernels: list[tuple[str, str, str | None, Any]], out: Profile,
                   background: dict[str, list[tuple[int, int, float]]]) -> list[float]:
    """Each kernel's share of its device, in seconds (its own time where the stats carry no
    absolute times), beside the device's ``background`` work (``processor_sharing``); fills
    ``out``'s kernel, busy and span times."""
    spans = [_kernel_span(ns) for _, _, _, ns in kernels]
    raw = [_seconds(ns) for _, _, _, ns in kernels]
    shares = list(raw)
    by_device: dict[str, list[int]] = defaultdict(list)
    for k, (device, _, _, _) in enumerate(kernels):
        by_device[device].append(k)
    for device, ks in by_device.items():
        out.kernel_s[device] = sum(raw[k] for k in ks)
        timed = [k for k in ks if spans[k] is not None]
        if len(timed) < len(ks):
            out.busy_s[device] = out.kernel_s[device]
            continue
        share_at, busy = processor_sharing([spans[k] for k in timed],  # type: ignore[misc]
                                           background.get(device, ()))
        for k, v in zip(timed, share_at):
            shares[k] = v
        out.busy_s[device] = busy
    known = [sp for sp in spans if sp is not None]
    if known:
        out.span_s = (max(e for _, e in known) - min(b for b, _ in known)) / 1e9
    return shares


def _absolute_end(ns: Any) -> float | None:
    """When a node finished, in seconds since the epoch (None when the stats lack it)."""
    start = getattr(ns, "all_start_micros", None)
    if not start:
        return None
    return start / 1e6 + _wall_seconds(ns)


def _recv_tensor_sample(ns: Any, produced: dict[tuple[str, str], float | None]
                        ) -> list[tuple[TransferSample, tuple[int, int] | None]]:
    """A cross-process transfer and when it ran (nanoseconds since the epoch, None when the
    stats lack absolute times). The receiver asks as soon as its step starts, so the call
    also waits for the sender to produce the tensor: when the producer's end is in the
    trace (same clock: one machine, or synchronized ones), the transfer starts there."""
    m = _RECV_TENSOR.search(ns.timeline_label)
    if not m:
        return []
    tensor = m.group("tensor")
    src, dst = devices.canonical(m.group("src")), devices.canonical(m.group("dst"))
    seconds = _wall_seconds(ns)
    end = _absolute_end(ns)
    ready = produced.get((src, tensor))
    if end is not None and ready is not None and end - seconds < ready < end:
        seconds = end - ready
    span = None if end is None else (int(1e9 * (end - seconds)), int(1e9 * end))
    return [(TransferSample(src, dst, _output_bytes(ns), seconds, tensor), span)]
