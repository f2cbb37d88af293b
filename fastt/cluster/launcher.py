"""``fastt cluster up | down | status | kill | restart``: a local cluster that outlives the
command.

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
from typing import Any, Callable

from fastt.cluster.health import ping
from fastt.cluster.local import LocalCluster, signal_group
from fastt.errors import ClusterError
from fastt.jsonio import check_output, json_kind, read_json, writing

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
    """The workers recorded in state file ``path`` (none when there is no file);
    ``ClusterError`` naming the file when it is not a fastt cluster state file."""
    if not os.path.lexists(path):
        return []
    what = "cluster state file"
    doc = read_json(path, what, ClusterError, expect=dict)
    if doc.get("schema") != SCHEMA:
        raise ClusterError(f"{what} {str(path)!r} is not a fastt cluster state file (schema "
                           f"{doc.get('schema')!r}, expected {SCHEMA!r})")
    workers = doc.get("workers")
    if not isinstance(workers, list):
        raise ClusterError(f"{what} {str(path)!r}: 'workers' is {json_kind(workers)}, "
                           "expected an array")
    return [_worker(path, k, w) for k, w in enumerate(workers)]


_FIELDS = {"index": int, "address": str, "pid": int, "started": int, "cores": list, "log": str}


def _worker(path: Path, k: int, w: Any) -> WorkerState:
    """Entry ``k`` of a state file's workers, its fields checked."""
    where = f"cluster state file {str(path)!r}: workers[{k}]"
    if not isinstance(w, dict):
        raise ClusterError(f"{where} is {json_kind(w)}, expected an object")
    missing = [f for f in _FIELDS if f not in w]
    if missing:
        raise ClusterError(f"{where} has no {', '.join(missing)}")
    for name, kind in _FIELDS.items():
        if not isinstance(w[name], kind) or isinstance(w[name], bool):
            raise ClusterError(f"{where}.{name} is {json_kind(w[name])}, expected "
                               f"{json_kind(kind())}")
    if not all(isinstance(c, int) and not isinstance(c, bool) for c in w["cores"]):
        raise ClusterError(f"{where}.cores is not a list of core numbers")
    if w["pid"] < 1:
        raise ClusterError(f"{where}.pid is {w['pid']}, not a process id")
    return WorkerState(**{f: w[f] for f in _FIELDS})


def up(workers: int, cores_per_worker: int = 1, port: int | None = None,
       path: Path | None = None, timeout: float = 60.0,
       starting: Callable[[], None] | None = None) -> str:
    """Start the cluster; returns its ``FASTT_CLUSTER`` value. ``starting``: called once the
    state file and the ports are checked, before the workers start."""
    path = path or state_path()
    running = [w for w in load(path) if w.running()]
    if running:
        raise ClusterError(f"a local cluster is already up ({', '.join(w.address for w in running)}"
                           f", state {path}); run 'fastt cluster down' first")
    ports = list(range(port, port + workers)) if port else None
    if ports and ports[-1] > 65535:
        raise ClusterError(f"--port {port}: {workers} workers need ports up to {ports[-1]}, "
                           "above 65535")
    # where the state goes, checked before any worker starts: none is left unrecorded
    check_output(path, "cluster state file", parents=True, error=ClusterError)
    with writing(path, "cluster state file", ClusterError):
        (path.parent / "logs").mkdir(parents=True, exist_ok=True)
    cluster = LocalCluster(workers, cores_per_worker, ports, log_dir=str(path.parent / "logs"),
                           detached=True)
    if starting:
        starting()
    cluster.start(timeout)
    states = [WorkerState(i, a, p.pid, _start_time(p.pid) or -1, c, lg) for i, (a, p, c, lg)
              in enumerate(zip(cluster.addresses, cluster.procs, cluster.cores, cluster.logs))]
    doc = {"schema": SCHEMA, "version": 1, "cluster": cluster.spec,
           "cores_per_worker": cores_per_worker, "workers": [w.__dict__ for w in states]}
    try:
        _write(path, doc)
    except ClusterError:
        cluster.stop()  # unrecorded, no 'fastt cluster down' could stop them
        raise
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
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        raise ClusterError(f"stopped {len(running)} worker(s), but cannot remove cluster state "
                           f"file {str(path)!r}: {e.strerror or e}") from None
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


SIGNALS = {"KILL": signal.SIGKILL, "STOP": signal.SIGSTOP, "CONT": signal.SIGCONT,
           "TERM": signal.SIGTERM}


def kill(index: int, sig: str = "KILL", path: Path | None = None) -> WorkerState:
    """Send ``sig`` (``SIGNALS``: KILL, a worker lost; STOP, one that stops answering; CONT,
    one that resumes; TERM) to recorded worker ``index``, to test how training survives it;
    the worker. Its entry stays in the state file, so ``down`` still stops the others."""
    path = path or state_path()
    if sig not in SIGNALS:
        raise ClusterError(f"signal {sig!r}: expected one of {', '.join(SIGNALS)}")
    workers = {w.index: w for w in load(path)}
    if index not in workers:
        raise ClusterError(f"no worker {index} in cluster state file {str(path)!r} (workers: "
                           f"{', '.join(map(str, sorted(workers))) or 'none'})")
    w = workers[index]
    if not w.running():
        raise ClusterError(f"worker {index} ({w.address}, pid {w.pid}) is not running")
    signal_group(w.pid, SIGNALS[sig])
    return w


def restart(index: int, path: Path | None = None, timeout: float = 60.0) -> WorkerState:
    """Start recorded worker ``index`` again at its address, after it was killed (a worker
    that comes back); its new process recorded in the state file."""
    path = path or state_path()
    workers = load(path)
    by_index = {w.index: w for w in workers}
    if index not in by_index:
        raise ClusterError(f"no worker {index} in cluster state file {str(path)!r} (workers: "
                           f"{', '.join(map(str, sorted(by_index))) or 'none'})")
    w = by_index[index]
    if w.running():
        raise ClusterError(f"worker {index} ({w.address}, pid {w.pid}) is still running; "
                           f"'fastt cluster kill {index}' first")
    doc = read_json(path, "cluster state file", ClusterError, expect=dict)
    ordered = sorted(workers, key=lambda x: x.index)
    cluster = LocalCluster(len(ordered), len(w.cores), detached=True)
    cluster.addresses = [x.address for x in ordered]
    cluster.cores, cluster.logs = [x.cores for x in ordered], [x.log for x in ordered]
    proc = cluster.restart(ordered.index(w), timeout)
    w.pid, w.started = proc.pid, _start_time(proc.pid) or -1
    doc["workers"] = [x.__dict__ for x in ordered]
    _write(path, doc)
    return w


def _write(path: Path, doc: dict[str, Any]) -> None:
    """The state file, replaced whole."""
    with writing(path, "cluster state file", ClusterError):
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
