"""The plugin on a TensorFlow cluster (``FASTT_CLUSTER`` or ``TF_CONFIG``).

The user's local sessions (target ``""``) are pointed at the cluster's master with isolated
session state, as a local session's state is its own; fastt plans over every task's devices
and drives them from this one client (in-graph, as FastT did).
"""
from __future__ import annotations

import logging
import math
import threading
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from fastt.cluster.health import unanswered
from fastt.cluster.spec import ClusterSpec, Task, on_tasks
from fastt.devices import canonical, device_type
from fastt.sched.sim.problem import Device
from tf_patches import session_hook as hook

if TYPE_CHECKING:
    from fastt.adapters.engine import Engine

_tf1 = tf.compat.v1
# TensorFlow's master waits for ever for a lost worker when it creates a session (the first
# run on a new session); on the cluster that call gets this deadline. Steps carry their own
# (RunOptions.timeout_in_ms overrides it).
CALL_TIMEOUT_MS = 30_000
# What a lost or hung server makes a step fail with.
STEP_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
               tf.errors.AbortedError, tf.errors.InternalError, tf.errors.UnknownError,
               tf.errors.CancelledError)


def retarget(spec: ClusterSpec, target: Any, config: Any, elastic: bool = False
             ) -> tuple[Any, Any]:
    """The session hook's ``retarget``: a local session runs on the cluster instead; a
    script that chose its own server keeps it. With recovery on (``elastic``), a server
    other than the master that does not answer is left out (``started_without``): the
    session would wait for it, then fail."""
    _made.without = []
    if target:
        return target, config
    cfg = on_cluster(config)
    if elastic and not cfg.device_filters:
        out = [t for t, _ in unanswered([t for t in spec.tasks if t != spec.master],
                                        START_PING_S)]
        if out:
            cfg.device_filters[:] = [t.device_prefix for t in spec.tasks if t not in out]
            _made.without = out
            if set(out) - _said:
                _said.update(out)
                log.warning("fastt: %s do%s not answer; training starts without %s, and "
                            "the first plan after %s answer%s takes %s in",
                            ", ".join(map(str, out)), "es" if len(out) == 1 else "",
                            *(("it", "it", "s", "it") if len(out) == 1 else
                              ("them", "they", "", "them")))
    return spec.target, cfg


def started_without() -> list[Task]:
    """The servers the session just made on this thread was left without (``retarget``)."""
    return list(getattr(_made, "without", []))


_made = threading.local()
_said: set[Task] = set()  # servers said to be left out at start
log = logging.getLogger("fastt")
START_PING_S = 2.0  # a server that does not answer a new session's check within it is out


def on_cluster(config: Any) -> Any:
    """A copy of ``config`` for a session on the cluster: state isolated, as a local
    session's is, and a deadline on calls that could wait for a lost worker."""
    cfg = _tf1.ConfigProto()
    if config is not None:
        cfg.CopyFrom(config)
    cfg.isolate_session_state = True
    if not cfg.operation_timeout_in_ms:
        cfg.operation_timeout_in_ms = CALL_TIMEOUT_MS
    return cfg


def inner_config(config: Any, logical_cpus: int, cluster: bool,
                 tasks: list[Task] | None = None) -> Any:
    """The config of fastt's own sessions: the user's ``config`` with ``logical_cpus`` CPU
    devices; on a ``cluster``, as ``on_cluster`` makes it, its master contacting only
    ``tasks`` when given (the servers left)."""
    cfg = _tf1.ConfigProto()
    if config is not None:
        cfg.CopyFrom(config)
    if logical_cpus > cfg.device_count.get("CPU", 1):
        cfg.device_count["CPU"] = logical_cpus
    if not cluster:
        return cfg
    cfg = on_cluster(cfg)
    if tasks is not None:
        cfg.device_filters[:] = [t.device_prefix for t in tasks]
    return cfg


def step_devices(sess: Any, settings: Any, gone: set[Task]) -> tuple[list[Device], str]:
    """The devices to plan a session's training step over (``devices``), less those of the
    servers ``gone``; or why none (``FASTT_DEVICES`` names a device the session lacks)."""
    absent, listed = missing(sess, settings.devices, settings.logical_cpus)
    if absent:
        return [], (f"FASTT_DEVICES names {', '.join(absent)}, which this session does not "
                    f"have (it has {', '.join(listed)})")
    found = devices(sess, settings.devices, settings.device_memory_mb * 2 ** 20,
                    settings.cpu_allocator_mb * 2 ** 20)
    return [d for d in found if not on_tasks(d.name, gone)], ""


def planning_devices(listed: list[Any]) -> list[str]:
    """The devices to plan over, from ``Session.list_devices()``: the GPUs when there are
    any, else the first CPU of each task (a task's CPU devices share its cores)."""
    gpus = [d.name for d in listed if d.device_type == "GPU"]
    if gpus:
        return gpus
    per_task: dict[str, str] = {}
    for d in sorted(listed, key=lambda d: d.name):
        if d.device_type == "CPU":
            per_task.setdefault(d.name.rsplit("/device:", 1)[0], d.name)
    return list(per_task.values())


def devices(sess: Any, names: list[str], limit: float = math.inf,
            cpu_allocator: float = math.inf) -> list[Device]:
    """The devices to plan over: ``names`` (``FASTT_DEVICES``), else ``planning_devices``;
    a GPU's memory from ``Session.list_devices()``; this process's CPU devices share
    ``cpu_allocator`` bytes (TensorFlow's CPU allocator is one per process), in equal parts;
    other CPUs are unbounded; none above ``limit`` bytes (``FASTT_DEVICE_MEMORY_MB``)."""
    listed = sess.list_devices()
    memory = {d.name: float(d.memory_limit_bytes) for d in listed if d.memory_limit_bytes}
    chosen = names or planning_devices(listed)
    local = [n for n in chosen if device_type(n) == "CPU" and n.startswith("/job:localhost/")]
    share = cpu_allocator / len(local) if local else math.inf

    def held(n: str) -> float:
        if device_type(n) != "CPU":
            return memory.get(n, math.inf)
        return share if n in local else math.inf

    return [Device(n, min(limit, held(n))) for n in chosen]


def task_devices(target: str, config: Any, tasks: list[Task], names: list[str],
                 limit: float = math.inf) -> list[Device]:
    """The devices to plan over on ``tasks`` (servers that were not planned over before),
    as ``devices`` chooses them (of ``names``, those on ``tasks``), listed by a session
    that contacts only them."""
    on = [n for n in names if on_tasks(n, tasks)]
    if names and not on:
        return []
    cfg = on_cluster(config)
    cfg.device_filters[:] = [t.device_prefix for t in tasks]
    with hook.plain_sessions():
        sess = _tf1.Session(target, graph=tf.Graph(), config=cfg)
    try:  # the master lists its own devices too
        return [d for d in devices(sess, on, limit) if on_tasks(d.name, tasks)]
    finally:
        sess.close()


def enforced_memory(sess: Any, names: list[str], cpu_allocator: float = math.inf) -> float:
    """The bytes TensorFlow lets a step hold on the first device fastt would plan over, alone:
    a GPU's memory as the session lists it, ``cpu_allocator`` on a CPU of this process (its
    allocator's limit), unbounded on another CPU."""
    first = devices(sess, names[:1])[0].name
    if device_type(first) == "CPU":
        return cpu_allocator if first.startswith("/job:localhost/") else math.inf
    return devices(sess, [first])[0].memory


def allocated(device: str) -> float | None:
    """The bytes TensorFlow's allocator for ``device`` (of this process) holds now, where it
    counts them (a BFC allocator: a GPU's, the CPU's with ``TF_CPU_ALLOCATOR_USE_BFC``);
    None otherwise."""
    if not device.startswith("/job:localhost/"):
        return None
    try:
        return float(tf.config.experimental.get_memory_info(device.rsplit("/device:", 1)[-1])
                     ["current"])
    except (ValueError, KeyError, tf.errors.OpError):
        return None


def missing(sess: Any, names: list[str], logical_cpus: int) -> tuple[list[str], list[str]]:
    """Of ``names`` (``FASTT_DEVICES``), those neither ``sess`` has nor fastt's own sessions
    will (``logical_cpus`` CPU devices of this process); and the devices it has."""
    listed = sorted(d.name for d in sess.list_devices())
    local = {canonical(f"/device:CPU:{i}") for i in range(logical_cpus)}
    return [n for n in names if n not in listed and n not in local], listed


def held(engine: Engine) -> float:
    """The bytes the first device holds beyond ``engine``'s step: the script's own session,
    its variables (of which fastt's session holds the training copy) and its input pipeline's
    tensors and buffers, as TensorFlow's allocator counts them now (``allocated``), or
    by the models where more (an iterator that has not run yet holds its tensors once it
    does: ``Engine.input_bytes``)."""
    now = allocated(engine.devices[0].name) or 0.0
    return max(now, engine.variable_bytes() + engine.input_bytes())


def misfit_limit(sess: Any, engine: "Engine", settings: Any,
                 feed_shapes: dict[str, tuple[int, ...]], names: list[str]) -> float:
    """The memory TensorFlow enforces on the first device (a GPU's; this process's CPU
    allocator's limit) when the first run of ``names`` would hold more by fastt's memory
    model, from the shapes fed (shapes left unknown count as nothing); else infinity."""
    limit = enforced_memory(sess, settings.devices, settings.cpu_allocator_mb * 2 ** 20)
    if limit == math.inf:
        return limit
    engine.fetches = [n.split(":")[0] for n in names]
    engine.assume_fed(feed_shapes)
    engine.devices = devices(sess, settings.devices[:1])
    # what the device holds beyond the variables (an input pipeline's tensors) too
    if engine.original_peak() + held(engine) - engine.variable_bytes() <= limit:
        return math.inf
    return limit
