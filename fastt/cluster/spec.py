"""Which TensorFlow servers make up a cluster: ``FASTT_CLUSTER`` or the standard ``TF_CONFIG``.

No TensorFlow here. A ``ClusterSpec`` lists the tasks (job, index, address) in TensorFlow's
order; fastt drives all of them from one client (in-graph), through the master task: the
``chief`` when there is one, else task 0 of the first job.
"""
from __future__ import annotations

import json
import re
from typing import Iterable
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

    def holds(self, device: str) -> bool:
        """Whether ``device`` (a full device name) is one of this task's."""
        return device.startswith(self.device_prefix + "/")


def on_tasks(device: str, tasks: Iterable[Task]) -> bool:
    """Whether ``device`` is one of ``tasks``'s devices."""
    return any(t.holds(device) for t in tasks)


@dataclass(frozen=True)
class ClusterSpec:
    jobs: tuple[tuple[str, tuple[str, ...]], ...]
    # per job, the task index of each address (TF_CONFIG's sparse form); empty: 0, 1, ...
    indices: tuple[tuple[int, ...], ...] = ()

    @property
    def tasks(self) -> list[Task]:
        indices = self.indices or tuple(tuple(range(len(a))) for _, a in self.jobs)
        return [Task(job, i, a) for (job, addresses), numbers in zip(self.jobs, indices)
                for i, a in zip(numbers, addresses)]

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
        return next((t for t in self.tasks if t.holds(device)), None)


# TensorFlow's job names (``IsJobName`` in its device_name_utils.cc): a letter, then letters,
# digits and underscores
JOB_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def check_job(source: str, job: str) -> str:
    """``job`` when it is a TensorFlow job name; ``ClusterError`` naming ``source``."""
    if not JOB_NAME.fullmatch(job):
        raise ClusterError(f"{source}: {job!r} is not a TensorFlow job name (a letter, then "
                           "letters, digits or underscores)")
    return job


def _check_address(source: str, address: str) -> str:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(f"{source}: {address!r} is not host:port")
    return address


def parse_cluster_spec(spec: str, job: str = "worker", source: str = "") -> ClusterSpec:
    """``'127.0.0.1:2222,127.0.0.1:2223'`` (``FASTT_CLUSTER``): tasks 0, 1, ... of ``job``;
    errors name ``source`` (default: the cluster spec)."""
    source = source or f"cluster spec {spec!r}"
    addresses = [a.strip() for a in spec.split(",") if a.strip()]
    if not addresses:
        raise ClusterError(f"{source} names no worker (expected host:port,...)")
    if len(set(addresses)) != len(addresses):
        raise ClusterError(f"{source}: an address is listed twice")
    check_job(source, job)
    return ClusterSpec(((job, tuple(_check_address(source, a) for a in addresses)),))


def from_tf_config(text: str) -> ClusterSpec:
    """The ``cluster`` of a ``TF_CONFIG`` JSON document, e.g.
    ``{"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {...}}``; a job may also
    be given in the sparse form, task index to address: ``{"worker": {"1": "host2:2222"}}``."""
    source = "TF_CONFIG"
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ClusterError(f"{source} is not JSON: {e}") from None
    cluster = doc.get("cluster") if isinstance(doc, dict) else None
    if not isinstance(cluster, dict) or not cluster:
        raise ClusterError(f"{source} has no 'cluster' object of jobs")
    jobs, indices = [], []
    for job in sorted(cluster, key=lambda j: (j != "chief", j)):
        check_job(f"{source} cluster", job)
        numbers, addresses = _tasks(f"{source} job {job!r}", cluster[job])
        jobs.append((job, tuple(_check_address(f"{source} job {job!r}", a) for a in addresses)))
        indices.append(numbers)
    if not any(a for _, a in jobs):
        raise ClusterError(f"{source} names no task")
    return ClusterSpec(tuple(jobs), tuple(indices))


def _tasks(source: str, tasks: object) -> tuple[tuple[int, ...], list[str]]:
    """A job's task indices and addresses: a list (tasks 0, 1, ...) or the sparse form, a
    mapping of task index (a whole number, as a string) to address."""
    if isinstance(tasks, dict):
        bad = [k for k in tasks if not (k.isascii() and k.isdigit())]
        if bad:
            raise ClusterError(f"{source}: task key {bad[0]!r} is not a task index (the sparse "
                               'form maps task indices to addresses: {"0": "host:port", ...})')
        numbers = sorted(tasks, key=int)
        if len({int(k) for k in numbers}) != len(numbers):
            raise ClusterError(f"{source}: a task index is given twice ({sorted(tasks)})")
        addresses = [tasks[k] for k in numbers]
        index = tuple(int(k) for k in numbers)
    else:
        addresses = tasks if isinstance(tasks, list) else []
        index = tuple(range(len(addresses)))
    if not isinstance(tasks, (dict, list)) or not all(isinstance(a, str) for a in addresses):
        raise ClusterError(f"{source} is not a list of host:port strings (nor a mapping of "
                           "task index to host:port)")
    return index, addresses
