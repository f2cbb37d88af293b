"""Which TensorFlow servers make up a cluster: ``FASTT_CLUSTER`` or the standard ``TF_CONFIG``.

No TensorFlow here. A ``ClusterSpec`` lists the tasks (job, index, address) in TensorFlow's
order; fastt drives all of them from one client (in-graph), through the master task: the
``chief`` when there is one, else task 0 of the first job.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from fastt.errors import ClusterError


@dataclass(frozen=True)
class Task:
    job: str
    index: int
    address: str

    @property
    def device_prefix(self) -> str:
        return f"/job:{self.job}/replica:0/task:{self.index}"

    def __str__(self) -> str:
        return f"{self.job} {self.index} ({self.address}, {self.device_prefix})"


@dataclass(frozen=True)
class ClusterSpec:
    jobs: tuple[tuple[str, tuple[str, ...]], ...]

    @property
    def tasks(self) -> list[Task]:
        return [Task(job, i, a) for job, addresses in self.jobs
                for i, a in enumerate(addresses)]

    @property
    def master(self) -> Task:
        tasks = self.tasks
        return next((t for t in tasks if t.job == "chief"), tasks[0])

    @property
    def target(self) -> str:
        """The session target the user's sessions are pointed at."""
        return f"grpc://{self.master.address}"

    @property
    def value(self) -> str:
        """As ``FASTT_CLUSTER`` would say it (job names other than ``worker`` are lost)."""
        return ",".join(t.address for t in self.tasks)

    def task_of(self, device: str) -> Task | None:
        for t in self.tasks:
            if device.startswith(t.device_prefix + "/"):
                return t
        return None


def _check_address(source: str, address: str) -> str:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(f"{source}: {address!r} is not host:port")
    return address


def parse_cluster_spec(spec: str, job: str = "worker") -> ClusterSpec:
    """``'127.0.0.1:2222,127.0.0.1:2223'`` (``FASTT_CLUSTER``): tasks 0, 1, ... of ``job``."""
    addresses = [a.strip() for a in spec.split(",") if a.strip()]
    if not addresses:
        raise ClusterError(f"cluster spec {spec!r} names no worker (expected host:port,...)")
    source = f"cluster spec {spec!r}"
    if len(set(addresses)) != len(addresses):
        raise ClusterError(f"{source}: an address is listed twice")
    return ClusterSpec(((job, tuple(_check_address(source, a) for a in addresses)),))


def from_tf_config(text: str) -> ClusterSpec:
    """The ``cluster`` of a ``TF_CONFIG`` JSON document, e.g.
    ``{"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {...}}``."""
    source = "TF_CONFIG"
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ClusterError(f"{source} is not JSON: {e}") from None
    cluster = doc.get("cluster") if isinstance(doc, dict) else None
    if not isinstance(cluster, dict) or not cluster:
        raise ClusterError(f"{source} has no 'cluster' object of jobs")
    jobs = []
    for job in sorted(cluster, key=lambda j: (j != "chief", j)):
        addresses = cluster[job]
        if isinstance(addresses, dict):  # sparse form: {"0": "host:port", ...}
            addresses = [addresses[k] for k in sorted(addresses, key=int)]
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise ClusterError(f"{source}: job {job!r} is not a list of host:port strings")
        jobs.append((job, tuple(_check_address(f"{source} job {job!r}", a) for a in addresses)))
    if not any(a for _, a in jobs):
        raise ClusterError(f"{source} names no task")
    return ClusterSpec(tuple(jobs))
