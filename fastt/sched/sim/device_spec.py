"""Device sets for planning: ``4xV100``, ``8xV100:pcie``, ``8xV100:dgx1``, ``16xV100:nvswitch``,
``2x4xV100`` (two servers), or JSON.

Links are ``seconds = latency + bytes / bandwidth``. Defaults (override in a JSON file): NVLink
2.0 between GPUs of one server 25 GB/s and 5 us; PCIe 3.0 x16 12 GB/s and 10 us; between
servers 100 Gb/s InfiniBand, 12.5 GB/s and 20 us. Within a server the GPUs are, by the suffix:
``nvlink`` (the default) one NVLink between every pair; ``pcie`` PCIe between every pair;
``dgx1`` the first N of a DGX-1's 8 GPUs in its hybrid cube-mesh (each V100 has six NVLinks of
25 GB/s each way, a pair joined by 2, 1 or no NVLink: ``DGX1_NVLINKS``; a pair with none goes
over PCIe; 4 GPUs are one socket's, all joined); ``nvswitch`` a DGX-2-style switch (up to 16
GPUs; each GPU's six NVLinks go to the switches, so every pair has 6 x 25 GB/s each way; what
one GPU sends to several at once shares those links, which pairwise links do not model). The
figures and their sources: ``benchmarks/results/published_v100.md``. ``with_host`` adds a
server's host CPU (TF-slim's parameter server) to a device set.

JSON device file::

    {"kind": "V100",
     "devices": [{"name": "/job:localhost/replica:0/task:0/device:GPU:0", "memory": 1.6e10}],
     "link": {"bandwidth_gbps": 25, "latency_us": 5},
     "pairs": [{"src": "...", "dst": "...", "bandwidth_gbps": 12, "latency_us": 10}]}
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

from fastt import devices as devnames
from fastt.errors import FasttError
from fastt.jsonio import interpreting, read_json
from fastt.sched.sim.problem import Device

GiB = 2 ** 30
MEMORY = {"V100": 16 * GiB, "P100": 16 * GiB, "A100": 40 * GiB, "CPU": math.inf}
LINKS = {"nvlink": (5e-6, 25e9), "pcie": (10e-6, 12e9), "ib": (20e-6, 12.5e9)}
# NVLinks between the GPUs of a DGX-1 (V100), GPU i to GPU j: the hybrid cube-mesh, two
# sockets of four (0-3, 4-7); each row sums to the V100's six links.
DGX1_NVLINKS = ((0, 2, 1, 1, 2, 0, 0, 0), (2, 0, 1, 2, 0, 1, 0, 0), (1, 1, 0, 2, 0, 0, 2, 0),
                (1, 2, 2, 0, 0, 0, 0, 1), (2, 0, 0, 0, 0, 2, 1, 1), (0, 1, 0, 0, 2, 0, 1, 2),
                (0, 0, 2, 0, 1, 1, 0, 2), (0, 0, 0, 1, 1, 2, 2, 0))
NVSWITCH_GPUS, NVLINKS_PER_GPU = 16, 6
# On-device copy rate (split, concat, sum): half the memory bandwidth (read + write).
COPY = {"V100": 450e9, "P100": 366e9, "A100": 777e9, "CPU": 10e9}
# The most devices fastt plans over. What a plan builds grows with the devices (the
# data-parallel graphs: one replica of every op per device; the ring all-reduce: O(D^2) ops per
# bucket; the links: O(D^2) pairs), and --budget never cuts the data-parallel layouts and the
# placers. Over 64 V100s the zoo's small models and ResNet-50 at batch 32 plan within the
# default 60 s on 2 cores (vgg_like, inception_like, transformer: 19-41 s; ResNet-50: 37 s),
# while ResNet-50 at batch 64 (64 replicas, 350k ops, 3.5 GB) takes 57-74 s; twice the devices
# doubles those graphs and their memory.
MAX_DEVICES = 64
_SPEC = re.compile(r"^(?:(\d+)x)?(\d+)x([A-Za-z0-9]+)(?::(nvlink|pcie|dgx1|nvswitch))?$",
                   re.IGNORECASE)


@dataclass
class DeviceSet:
    kind: str
    devices: list[Device]
    links: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    @property
    def copy_bytes_per_s(self) -> float:
        return COPY.get(self.kind, COPY["CPU"] if self.kind == "CPU" else COPY["V100"])

    def link(self, src: str, dst: str) -> tuple[float, float]:
        """(latency s, seconds per byte) of the src -> dst path."""
        if src == dst:
            return (0.0, 0.0)
        latency, bandwidth = self.links[(src, dst)]
        return (latency, 1.0 / bandwidth)


def parse(spec: str) -> DeviceSet:
    """A device set from ``NxKIND[:link]``, ``SxNxKIND[:link]`` or a JSON file path."""
    if os.path.exists(spec) or spec.endswith(".json"):
        return _from_file(spec)
    m = _SPEC.match(spec.strip())
    if not m:
        raise FasttError(f"device spec {spec!r}: expected e.g. 4xV100, 8xV100:pcie, "
                         "8xV100:dgx1, 16xV100:nvswitch, 2x4xV100 or a JSON device file")
    servers, per, kind = int(m.group(1) or 1), int(m.group(2)), m.group(3).upper()
    if kind not in MEMORY:
        raise FasttError(f"device spec {spec!r}: unknown kind {kind!r}; known: "
                         f"{', '.join(sorted(MEMORY))}")
    if servers < 1 or per < 1:
        raise FasttError(f"device spec {spec!r}: needs at least one device")
    check_count(spec, servers * per)
    topology = (m.group(4) or "nvlink").lower()
    if topology == "dgx1" and per > len(DGX1_NVLINKS):
        raise FasttError(f"device spec {spec!r}: a DGX-1 has {len(DGX1_NVLINKS)} GPUs, not {per}")
    if topology == "nvswitch" and per > NVSWITCH_GPUS:
        raise FasttError(f"device spec {spec!r}: an NVSwitch server holds at most "
                         f"{NVSWITCH_GPUS} GPUs, not {per}")
    dtype = "CPU" if kind == "CPU" else "GPU"
    job = "worker" if servers > 1 else "localhost"
    devs = [Device(f"/job:{job}/replica:0/task:{s}/device:{dtype}:{i}", MEMORY[kind])
            for s in range(servers) for i in range(per)]
    links = {}
    for x, a in enumerate(devs):
        for y, b in enumerate(devs):
            if a.name != b.name:
                same = devnames.same_process(a.name, b.name)
                links[(a.name, b.name)] = _local(topology, x % per, y % per) if same \
                    else LINKS["ib"]
    return DeviceSet(kind, devs, links)


# A DGX-1's host: two Xeon E5-2698 v4, each with four channels of DDR4-2133 (8 bytes per
# transfer): what a memory-bound op (a variable's update) reads and writes there, per second,
# against a V100's 900 GB/s of HBM2. Each GPU reaches it over its own PCIe 3.0 x16 link
# (the switches two GPUs share on the way are not modelled: the host's links are, if
# anything, faster than a DGX-1's).
HOST_MEMORY_BYTES_PER_S = 4 * 2133e6 * 8
GPU_MEMORY_BYTES_PER_S = {"V100": 900e9}


def with_host(ds: DeviceSet, host_bytes_per_s: float = HOST_MEMORY_BYTES_PER_S
              ) -> tuple[DeviceSet, Device, float]:
    """``ds`` with its first server's host CPU added (last), linked to that server's GPUs
    by PCIe (and to other servers' by InfiniBand): the device, and how many times slower a
    memory-bound op runs there than on one of ``ds``'s GPUs (the ratio of their memory
    bandwidths, the host's ``host_bytes_per_s``; TF-slim's parameter server keeps variables
    and their updates there)."""
    first = ds.devices[0].name
    host = Device(first.rsplit("/device:", 1)[0] + "/device:CPU:0", math.inf)
    links = dict(ds.links)
    for d in ds.devices:
        link = LINKS["pcie"] if devnames.same_process(d.name, host.name) else LINKS["ib"]
        links[(d.name, host.name)] = links[(host.name, d.name)] = link
    slowdown = GPU_MEMORY_BYTES_PER_S.get(ds.kind, host_bytes_per_s) / host_bytes_per_s
    return DeviceSet(ds.kind, [*ds.devices, host], links), host, slowdown


def _local(topology: str, i: int, j: int) -> tuple[float, float]:
    """(latency s, bytes per second) from GPU ``i`` to GPU ``j`` of one server."""
    if topology == "dgx1":
        n = DGX1_NVLINKS[i][j]
        return (LINKS["nvlink"][0], n * LINKS["nvlink"][1]) if n else LINKS["pcie"]
    if topology == "nvswitch":
        return (LINKS["nvlink"][0], NVLINKS_PER_GPU * LINKS["nvlink"][1])
    return LINKS[topology]


def check_count(spec: str, count: int) -> None:
    """A ``FasttError`` naming ``--devices`` when ``count`` is past ``MAX_DEVICES``."""
    if count > MAX_DEVICES:
        raise FasttError(f"--devices {spec!r}: {count} devices, more than the {MAX_DEVICES} "
                         "fastt plans over (its data-parallel and all-reduce graphs grow "
                         "with the devices, the links with their square)")


def _from_file(path: str) -> DeviceSet:
    data = read_json(path, "device file", expect=dict)
    with interpreting(path, "device file"):
        kind = str(data.get("kind", "GPU")).upper()
        devs = [Device(devnames.canonical(d["name"]), float(d.get("memory", math.inf)))
                for d in data["devices"]]
        check_count(path, len(devs))
        default = data.get("link", {"bandwidth_gbps": 25, "latency_us": 5})
        link = (float(default["latency_us"]) * 1e-6, float(default["bandwidth_gbps"]) * 1e9)
        links = {(a.name, b.name): link for a in devs for b in devs if a.name != b.name}
        for pair in data.get("pairs", []):
            key = (devnames.canonical(pair["src"]), devnames.canonical(pair["dst"]))
            links[key] = (float(pair["latency_us"]) * 1e-6, float(pair["bandwidth_gbps"]) * 1e9)
    if not devs:
        raise FasttError(f"device file {path!r} lists no device")
    return DeviceSet(kind, devs, links)
