"""A TensorFlow gRPC cluster of worker processes on this machine, each pinned to its own cores.

On a machine without GPUs this is the way to get devices that really run in parallel and really
pay for transfers. Servers listen on 127.0.0.1 only (through the loopback shim of
``tf_patches``). ``LocalCluster`` is a context manager: whatever happens inside, the processes
it started are stopped when it exits, and they also stop when the process that started them
dies; ``detached=True`` (``fastt cluster up``) leaves them running for ``fastt cluster down``.
"""
from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Sequence

from fastt.cluster.spec import ClusterSpec, parse_cluster_spec
from fastt.errors import ClusterError
from tf_patches.native import built

log = logging.getLogger("fastt")
HOST = "127.0.0.1"


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


def _cores_for(index: int, per_worker: int) -> list[int]:
    available = sorted(os.sched_getaffinity(0))
    start = (index * per_worker) % len(available)
    return sorted({available[(start + k) % len(available)] for k in range(per_worker)})


class LocalCluster:
    """``workers`` TensorFlow servers on 127.0.0.1, worker ``i`` pinned to its own cores with
    ``cores_per_worker`` intra-op threads. Each writes its log to ``log_dir/worker-<i>.log``
    (a temporary directory by default)."""

    def __init__(self, workers: int = 2, cores_per_worker: int = 1,
                 ports: Sequence[int] | None = None, job: str = "worker",
                 log_dir: str | None = None, detached: bool = False) -> None:
        if workers < 1:
            raise ClusterError(f"a cluster needs at least one worker, got {workers}")
        if cores_per_worker < 1:
            raise ClusterError(f"cores per worker must be >= 1, got {cores_per_worker}")
        if ports is not None and len(ports) != workers:
            raise ClusterError(f"{len(ports)} ports given for {workers} workers")
        self.workers, self.cores_per_worker, self.job = workers, cores_per_worker, job
        self.detached = detached
        self._ports = list(ports) if ports is not None else None
        self._log_dir = log_dir
        self._tmp_dir: str | None = None  # the log directory fastt made (removed at stop)
        self.addresses: list[str] = []
        self.cores: list[list[int]] = []
        self.logs: list[str] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self._env: dict[str, str] = {}

    @property
    def spec(self) -> str:
        """The ``FASTT_CLUSTER`` value: comma-separated addresses in task order."""
        return ",".join(self.addresses)

    @property
    def cluster_spec(self) -> ClusterSpec:
        return parse_cluster_spec(self.spec, self.job)

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
            raise ClusterError(f"port(s) {busy} on {HOST} are busy (another server listens "
                               "there); choose other ports, e.g. --port")
        if self.workers * self.cores_per_worker > len(os.sched_getaffinity(0)):
            log.warning("%d workers x %d cores is more than the %d cores here; workers "
                        "share cores", self.workers, self.cores_per_worker,
                        len(os.sched_getaffinity(0)))
        self.addresses = [f"{HOST}:{p}" for p in ports]
        log_dir = self._log_dir or tempfile.mkdtemp(prefix="fastt-cluster-")
        self._tmp_dir = None if self._log_dir else log_dir
        os.makedirs(log_dir, exist_ok=True)
        self._env = _worker_env()
        try:
            for i in range(self.workers):
                self.cores.append(_cores_for(i, self.cores_per_worker))
                self.logs.append(os.path.join(log_dir, f"worker-{i}.log"))
                self.procs.append(self._spawn(i))
            deadline = time.monotonic() + timeout
            for i in range(self.workers):
                self._await_ready(i, deadline)
        except BaseException:
            self.stop()
            raise
        log.info("local cluster up: %s", self.spec)
        return self

    def _spawn(self, i: int, mode: str = "wb") -> "subprocess.Popen[bytes]":
        cmd = [sys.executable, "-m", "fastt.cluster.worker", "--cluster", self.spec,
               "--index", str(i), "--job", self.job, "--threads", str(self.cores_per_worker)]
        with open(self.logs[i], mode) as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self._env,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=_pin_and_tie(self.cores[i], not self.detached))

    def restart(self, i: int, timeout: float = 60.0) -> "subprocess.Popen[bytes]":
        """Start worker ``i`` again at its address, after it was stopped or killed (a worker
        that comes back); its log goes on in the same file. Its process."""
        if not 0 <= i < len(self.addresses):
            raise ClusterError(f"no worker {i} in this cluster (workers 0 to "
                               f"{len(self.addresses) - 1})")
        if i < len(self.procs) and self.procs[i].poll() is None:
            raise ClusterError(f"worker {i} ({self.addresses[i]}) is still running")
        self._env = self._env or _worker_env()
        since = len(self.worker_log(i).encode())
        proc = self._spawn(i, "ab")
        if i < len(self.procs):
            self.procs[i] = proc
        self._await_ready(i, time.monotonic() + timeout, since, proc)
        log.info("worker %d restarted at %s", i, self.addresses[i])
        return proc

    def _await_ready(self, i: int, deadline: float, since: int = 0,
                     proc: "subprocess.Popen[bytes] | None" = None) -> None:
        proc = proc or self.procs[i]
        while True:
            text = self.worker_log(i).encode()[since:].decode(errors="replace")
            if any(line.startswith("ready ") for line in text.splitlines()):
                return
            code = proc.poll()
            if code is not None:
                tail = " | ".join(self.worker_log(i).strip().splitlines()[-3:])
                raise ClusterError(f"worker {i} ({self.addresses[i]}) exited at start "
                                   f"(code {code}): {tail}")
            if time.monotonic() > deadline:
                raise ClusterError(f"worker {i} ({self.addresses[i]}) did not start in time; "
                                   f"its log: {self.logs[i]}")
            time.sleep(0.1)

    def worker_log(self, i: int) -> str:
        """What worker ``i`` wrote so far."""
        try:
            with open(self.logs[i], "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def alive(self) -> list[bool]:
        return [p.poll() is None for p in self.procs]

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every process this cluster started (TERM, then KILL)."""
        for p in self.procs:
            if p.poll() is None:
                signal_group(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                signal_group(p.pid, signal.SIGKILL)
                p.wait()
        if self.procs:
            log.info("local cluster down: %s", self.spec)
        if self._tmp_dir:
            shutil.rmtree(self._tmp_dir, ignore_errors=True)
        self.procs, self._tmp_dir = [], None

    def __enter__(self) -> "LocalCluster":
        return self.start() if not self.procs else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _worker_env() -> dict[str, str]:
    """A worker's environment: the loopback shim preloaded where it was built."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    shim = built("_bind_loopback")
    if shim:
        env["LD_PRELOAD"] = " ".join(filter(None, [shim, env.get("LD_PRELOAD", "")]))
    else:
        log.warning("the loopback shim was not built at install (no C compiler?); "
                    "the workers listen on every interface of this machine and accept "
                    "connections from any user")
    return env


def signal_group(pid: int, sig: int) -> None:
    """``sig`` to the process group ``pid`` leads (each worker leads its own)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _pin_and_tie(cores: list[int], tie: bool):  # type: ignore[no-untyped-def]
    """The worker's pre-exec: pin it to ``cores``; when ``tie``, it gets SIGTERM when the
    process that started it dies (so a killed test or script leaves no server behind)."""
    def preexec() -> None:
        os.sched_setaffinity(0, cores)
        if tie:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    return preexec
