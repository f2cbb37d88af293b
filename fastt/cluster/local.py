"""A TensorFlow gRPC cluster of worker processes on this machine, each pinned to its own cores.

On a machine without GPUs this is the way to get devices that really run in parallel and really
pay for transfers. Servers bind 127.0.0.1 only. ``LocalCluster`` is a context manager: whatever
happens inside, the processes it started are stopped when it exits.
"""
from __future__ import annotations

import logging
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence

from fastt.errors import ClusterError

log = logging.getLogger("fastt")
HOST = "127.0.0.1"


def parse_cluster_spec(spec: str) -> list[str]:
    """``'127.0.0.1:2222,127.0.0.1:2223'`` -> addresses; a clear error for a malformed one."""
    addresses = [a.strip() for a in spec.split(",") if a.strip()]
    if not addresses:
        raise ClusterError(f"cluster spec {spec!r} names no worker (expected host:port,...)")
    for a in addresses:
        host, _, port = a.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ClusterError(f"cluster spec {spec!r}: {a!r} is not host:port")
    return addresses


def port_is_free(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(n: int, host: str = HOST) -> list[int]:
    """``n`` distinct ports the OS reports free right now."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _cores_for(index: int, per_worker: int) -> set[int]:
    available = sorted(os.sched_getaffinity(0))
    start = (index * per_worker) % len(available)
    return {available[(start + k) % len(available)] for k in range(per_worker)}


class LocalCluster:
    """``workers`` TensorFlow servers on 127.0.0.1, worker ``i`` pinned to its own cores."""

    def __init__(self, workers: int = 2, cores_per_worker: int = 1,
                 ports: Sequence[int] | None = None, job: str = "worker") -> None:
        if workers < 1:
            raise ClusterError(f"a cluster needs at least one worker, got {workers}")
        if cores_per_worker < 1:
            raise ClusterError(f"cores per worker must be >= 1, got {cores_per_worker}")
        if ports is not None and len(ports) != workers:
            raise ClusterError(f"{len(ports)} ports given for {workers} workers")
        self.workers, self.cores_per_worker, self.job = workers, cores_per_worker, job
        self._ports = list(ports) if ports is not None else None
        self.addresses: list[str] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[Any] = []  # each worker's stderr, kept in a temporary file

    @property
    def spec(self) -> str:
        """The ``FASTT_CLUSTER`` value: comma-separated addresses in task order."""
        return ",".join(self.addresses)

    @property
    def target(self) -> str:
        """Session target of task 0, the master the client talks to."""
        return f"grpc://{self.addresses[0]}"

    def device(self, task: int, kind: str = "CPU", index: int = 0) -> str:
        return f"/job:{self.job}/replica:0/task:{task}/device:{kind}:{index}"

    def start(self, timeout: float = 60.0) -> "LocalCluster":
        ports = self._ports or free_ports(self.workers)
        busy = [p for p in ports if not port_is_free(p)]
        if busy:
            raise ClusterError(f"port(s) {busy} on {HOST} are busy; choose other ports")
        self.addresses = [f"{HOST}:{p}" for p in ports]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        try:
            for i in range(self.workers):
                cores = _cores_for(i, self.cores_per_worker)
                cmd = [sys.executable, "-m", "fastt.cluster.worker", "--cluster", self.spec,
                       "--index", str(i), "--job", self.job,
                       "--threads", str(self.cores_per_worker)]
                self._logs.append(tempfile.TemporaryFile())
                self.procs.append(subprocess.Popen(
                    cmd, stdout=subprocess.PIPE, stderr=self._logs[-1], env=env,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                    preexec_fn=lambda c=cores: os.sched_setaffinity(0, c)))
            deadline = time.monotonic() + timeout
            for i, p in enumerate(self.procs):
                self._await_ready(i, p, deadline)
        except BaseException:
            self.stop()
            raise
        log.info("local cluster up: %s", self.spec)
        return self

    def _await_ready(self, i: int, p: subprocess.Popen[bytes], deadline: float) -> None:
        assert p.stdout is not None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClusterError(f"worker {i} ({self.addresses[i]}) did not start in time")
            ready, _, _ = select.select([p.stdout], [], [], min(left, 0.5))
            if ready:
                line = p.stdout.readline().decode(errors="replace")
                if line.startswith("ready"):
                    return
                if not line:  # EOF: the process died
                    code = p.wait()
                    tail = " | ".join(self.worker_log(i).strip().splitlines()[-3:])
                    raise ClusterError(f"worker {i} ({self.addresses[i]}) exited at start "
                                       f"(code {code}): {tail}")

    def worker_log(self, i: int) -> str:
        """What worker ``i`` wrote on stderr so far."""
        f = self._logs[i]
        f.seek(0)
        return f.read().decode(errors="replace")

    def alive(self) -> list[bool]:
        return [p.poll() is None for p in self.procs]

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every process this cluster started (TERM, then KILL)."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
            if p.stdout is not None:
                p.stdout.close()
        for f in self._logs:
            f.close()
        if self.procs:
            log.info("local cluster down: %s", self.spec)
        self.procs, self._logs = [], []

    def __enter__(self) -> "LocalCluster":
        return self.start() if not self.procs else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
