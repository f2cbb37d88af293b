"""Per-op compute-time estimates on simulated devices, from grappler's analytical cost model.

Grappler's ``VirtualCluster`` runs a graph through its ``VirtualScheduler`` with the
``AnalyticalCostEstimator`` (per op: ``OpLevelCostEstimator``, a roofline of FLOPs and
bytes against the device's peak), so no GPU is needed. Only private TensorFlow API is used
here: ``tensorflow.python.grappler.{cluster,item}`` and ``device_properties_pb2``.

How the estimator reads ``DeviceProperties`` (``OpLevelCostEstimator::GetDeviceInfo``):
``frequency`` is in MHz, ``bandwidth`` in KB/s (GB/s = bandwidth / 1e6). A GPU's peak
is ``num_cores * frequency * cores_per_SM * 2`` FLOP/s, with 64 cores per SM for
``environment["architecture"] >= "6"``; without an "architecture" entry a GPU is a dummy
100 GFLOP/s. A CPU's peak is ``num_cores * frequency`` (no SIMD). The other fields are
informational.

Per-op times come from the step stats of the simulated run: ``op_end_rel_nanos -
op_start_rel_nanos`` (the ``*_micros`` fields and the cost graph behind ``op_perfs`` are
rounded to whole microseconds, which zeroes most small ops). The item is built without
grappler's optimizers, so the reported names are the graph's own; every op in the fetches'
fan-in is reported (``NoOp`` with 0 s), ops outside it are not.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable, Union

from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import device_properties_pb2, meta_graph_pb2
from tensorflow.python.grappler import cluster as gcluster
from tensorflow.python.grappler import item as gitem

log = logging.getLogger("fastt")

DEVICE_NAME = "/job:localhost/replica:0/task:0/device:{type}:0"
_KiB, _MiB, _GiB = 1 << 10, 1 << 20, 1 << 30


def _nvidia(model: str, mhz: int, sms: int, arch: str, cuda: str, cudnn: str, l1_kib: int,
            l2_mib: int, smem_kib: int, gib: int, gb_per_s: int) -> dict[str, Any]:
    """An NVIDIA GPU's ``DeviceProperties`` fields (bandwidth in KB/s, as grappler reads it)."""
    return {"type": "GPU", "vendor": "NVIDIA", "model": model, "frequency": mhz,
            "num_cores": sms, "environment": {"architecture": arch, "cuda": cuda,
                                              "cudnn": cudnn},
            "num_registers": 65536, "l1_cache_size": l1_kib * _KiB,
            "l2_cache_size": l2_mib * _MiB, "shared_memory_size_per_multiprocessor":
            smem_kib * _KiB, "memory_size": gib * _GiB, "bandwidth": gb_per_s * 1_000_000}


# NVIDIA Tesla V100-SXM2-16GB: 80 SMs at 1530 MHz boost (15.7 TFLOP/s fp32), HBM2 900 GB/s.
V100 = _nvidia("Tesla V100-SXM2-16GB", 1530, 80, "7.0", "10000", "7600", 128, 6, 96, 16, 900)
# NVIDIA Tesla P100-SXM2-16GB: 56 SMs at 1480 MHz (10.6 TFLOP/s fp32), HBM2 732 GB/s.
P100 = _nvidia("Tesla P100-SXM2-16GB", 1480, 56, "6.0", "9000", "7000", 24, 4, 64, 16, 732)
# NVIDIA A100-SXM4-40GB: 108 SMs at 1410 MHz (19.5 TFLOP/s fp32, no tensor cores), 1555 GB/s.
A100 = _nvidia("A100-SXM4-40GB", 1410, 108, "8.0", "11000", "8000", 192, 40, 164, 40, 1555)
# A generic 8-core 2.5 GHz server CPU. Grappler rates a CPU at num_cores * frequency FLOP/s
# (no SIMD, no FMA), so its estimates are far slower than a real CPU: use for ranking only.
CPU: dict[str, Any] = {
    "type": "CPU", "vendor": "GenuineIntel", "model": "generic",
    "frequency": 2500, "num_cores": 8,
    "l1_cache_size": 32 * _KiB, "l2_cache_size": 1 * _MiB, "l3_cache_size": 32 * _MiB,
    "memory_size": 64 * _GiB, "bandwidth": 100_000_000,
}
DEVICES: dict[str, dict[str, Any]] = {"V100": V100, "P100": P100, "A100": A100, "CPU": CPU}

GraphLike = Union[graph_pb2.GraphDef, meta_graph_pb2.MetaGraphDef]


def device_properties(kind: str) -> device_properties_pb2.DeviceProperties:
    """The ``DeviceProperties`` proto of a known device kind ("V100", "P100", "A100", "CPU")."""
    spec = DEVICES.get(kind)
    if spec is None:
        raise ValueError(f"unknown device kind {kind!r}; known kinds: {', '.join(sorted(DEVICES))}")
    fields = dict(spec)
    env = fields.pop("environment", {})
    props = device_properties_pb2.DeviceProperties(**fields)
    props.environment.update(env)
    return props


def _op_name(name: str) -> str:
    """"^a", "a:1" -> "a"."""
    return name.lstrip("^").split(":")[0]


def fetch_fanin(graph_def: graph_pb2.GraphDef, fetch: Iterable[str]) -> set[str]:
    """Names of the ops the fetches depend on (data and control inputs), fetches included."""
    inputs = {n.name: n.input for n in graph_def.node}
    seen: set[str] = set()
    stack = [_op_name(f) for f in fetch]
    while stack:
        name = stack.pop()
        if name in seen or name not in inputs:
            continue
        seen.add(name)
        stack.extend(_op_name(i) for i in inputs[name])
    return seen


def _metagraph(graph_def_or_meta: GraphLike, fetch: list[str],
               device: str) -> meta_graph_pb2.MetaGraphDef:
    """A copy of the graph as a MetaGraphDef fetching ``fetch``, every op on ``device``."""
    meta = meta_graph_pb2.MetaGraphDef()
    if isinstance(graph_def_or_meta, meta_graph_pb2.MetaGraphDef):
        meta.CopyFrom(graph_def_or_meta)
    elif isinstance(graph_def_or_meta, graph_pb2.GraphDef):
        meta.graph_def.CopyFrom(graph_def_or_meta)
    else:
        raise TypeError("expected a GraphDef or MetaGraphDef, got "
                        f"{type(graph_def_or_meta).__name__}")
    train_op = meta.collection_def["train_op"].node_list.value
    del train_op[:]
    train_op.extend(fetch)
    for node in meta.graph_def.node:
        node.device = device
    return meta


def _warn_unknown_shapes(graph_def: graph_pb2.GraphDef, fanin: set[str]) -> None:
    """Grappler cannot size ops fed by placeholders of unknown shape: say so."""
    unknown = []
    for node in graph_def.node:
        if node.op.startswith("Placeholder") and node.name in fanin:
            shape = node.attr["shape"].shape
            if shape.unknown_rank or any(d.size < 0 for d in shape.dim):
                unknown.append(node.name)
    if unknown:
        log.warning("grappler costs: placeholders %s have unknown dimensions; the estimates of "
                    "the ops they feed are meaningless (fix the batch size)", sorted(unknown))


def analytical_costs(graph_def_or_meta: GraphLike, fetch: list[str],
                     kind: str = "V100") -> dict[str, float]:
    """Op name -> estimated seconds on one simulated device of ``kind``.

    Covers the ops the estimator reports: the fan-in of ``fetch`` (op or tensor names).
    Ops it does not report are absent; ``NoOp`` and similar free ops are present with 0.0.
    """
    if isinstance(fetch, str):
        fetch = [fetch]
    fetch = list(fetch)
    if not fetch:
        raise ValueError("analytical_costs needs at least one fetch name")
    props = device_properties(kind)
    # Times only: grappler refuses a graph whose (reuse-free) memory estimate exceeds the
    # device's, so it gets room here; fastt's own memory model decides what fits.
    props.memory_size = max(props.memory_size, 1 << 40)
    device = DEVICE_NAME.format(type=props.type)
    meta = _metagraph(graph_def_or_meta, fetch, device)
    known = {n.name for n in meta.graph_def.node}
    missing = [f for f in fetch if _op_name(f) not in known]
    if missing:
        raise ValueError(f"fetch names not in the graph: {missing}")
    fanin = fetch_fanin(meta.graph_def, fetch)
    _warn_unknown_shapes(meta.graph_def, fanin)

    item = gitem.Item(meta, ignore_colocation=True, ignore_user_placement=False)
    cluster = gcluster.Cluster(
        disable_timeline=False,  # the step stats are only returned with the timeline on
        devices=[device_properties_pb2.NamedDevice(name=device, properties=props)])
    try:
        _, run_time, step_stats = cluster.MeasureCosts(item)
    finally:
        cluster.Shutdown()

    costs: dict[str, float] = {}
    for dev in step_stats.dev_stats:
        for ns in dev.node_stats:
            nanos = ns.op_end_rel_nanos - ns.op_start_rel_nanos
            if nanos <= 0 and ns.op_end_rel_micros > ns.op_start_rel_micros:
                nanos = (ns.op_end_rel_micros - ns.op_start_rel_micros) * 1000
            costs[ns.node_name] = costs.get(ns.node_name, 0.0) + max(nanos, 0) * 1e-9

    foreign = sorted(set(costs) - known)
    if foreign:  # grappler-made nodes (e.g. _Send/_Recv): not the user's ops, dropped
        log.info("grappler costs: dropped %d reported names that are not graph ops, e.g. %s",
                 len(foreign), foreign[:5])
        costs = {name: t for name, t in costs.items() if name in known}
    covered = len(fanin & set(costs))
    log.info("grappler costs on %s: %d ops estimated, %d/%d (%.0f%%) of the fetch fan-in, "
             "simulated step %.1f us", kind, len(costs), covered, len(fanin),
             100.0 * covered / max(len(fanin), 1), run_time * 1e6)
    return costs
