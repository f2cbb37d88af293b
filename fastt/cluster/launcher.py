"""``fastt cluster up | down | status``: a local cluster that outlives the command.

``up`` starts detached workers and records them in a state file (JSON: address, pid, process
start time, cores, log of each); ``down`` stops exactly the processes recorded there (a pid
the system has since given to another process is left alone); ``status`` says whether each
is running and answering. No TensorFlow in this process.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from fastt.cluster.health import ping
from fastt.cluster.local import LocalCluster, signal_group
from fastt.errors import ClusterError

log = logging.getLogger("fastt")
SCHEMA = "fastt.local-cluster"


def state_path(path: str | None = None) -> Path:
    """``path``, else ``$FASTT_CLUSTER_STATE``, else ``$XDG_STATE_HOME/fastt/cluster.json``."""
    if path:
        return Path(path)
    if os.environ.get("FASTT_CLUSTER_STATE"):
        return Path(os.environ["FASTT_CLUSTER_STATE"])
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(base) / "fastt" / "cluster.json"


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])


@dataclass
class WorkerState:
    index: int
    address: str
    pid: int
    started: int
    cores: list[int]
    log: str

    def running(self) -> bool:
        """The recorded process, not a later one that reuses its pid."""
        return _start_time(self.pid) == self.started


def load(path: Path) -> list[WorkerState]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except ValueError as e:
        raise ClusterError(f"{path}: not a fastt cluster state file ({e})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ClusterError(f"{path}: not a fastt cluster state file (schema {SCHEMA!r})")
    return [WorkerState(**w) for w in doc["workers"]]


def up(workers: int, cores_per_worker: int = 1, port: int | None = None,
       path: Path | None = None, timeout: float = 60.0) -> str:
    """Start the cluster; returns its ``FASTT_CLUSTER`` value."""
    path = path or state_path()
    running = [w for w in load(path) if w.running()]
    if running:
        raise ClusterError(f"a local cluster is already up ({', '.join(w.address for w in running)}"
                           f", state {path}); run 'fastt cluster down' first")
    ports = list(range(port, port + workers)) if port else None
    if ports and ports[-1] > 65535:
        raise ClusterError(f"--port {port}: {workers} workers need ports up to {ports[-1]}, "
                           "above 65535")
    cluster = LocalCluster(workers, cores_per_worker, ports, log_dir=str(path.parent / "logs"),
                           detached=True)
    cluster.start(timeout)
    states = [WorkerState(i, a, p.pid, _start_time(p.pid) or -1, c, lg) for i, (a, p, c, lg)
              in enumerate(zip(cluster.addresses, cluster.procs, cluster.cores, cluster.logs))]
    doc = {"schema": SCHEMA, "version": 1, "cluster": cluster.spec,
           "cores_per_worker": cores_per_worker, "workers": [w.__dict__ for w in states]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return cluster.spec


def down(path: Path | None = None, timeout: float = 10.0) -> list[WorkerState]:
    """Stop the recorded workers (TERM, then KILL); returns those that were running."""
    path = path or state_path()
    running = [w for w in load(path) if w.running()]
    for w in running:
        signal_group(w.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(w.running() for w in running) and time.monotonic() < deadline:
        time.sleep(0.05)
    for w in running:
        if w.running():
            signal_group(w.pid, signal.SIGKILL)
    while any(w.running() for w in running):
        time.sleep(0.05)
    path.unlink(missing_ok=True)
    return running


def status(path: Path | None = None, timeout: float = 5.0) -> list[tuple[WorkerState, str]]:
    """Each recorded worker with what it is doing: ``answering (n ms)``, ``not answering``
    or ``not running``."""
    out = []
    for w in load(path or state_path()):
        if not w.running():
            out.append((w, "not running"))
            continue
        try:
            out.append((w, f"answering ({1e3 * ping(w.address, timeout):.1f} ms)"))
        except Exception as e:  # noqa: BLE001 - grpc.RpcError and friends
            out.append((w, f"running, not answering ({type(e).__name__})"))
    return out
