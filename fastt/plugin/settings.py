"""The session plugin's settings, read from environment variables (no TensorFlow here).

Every variable is documented in the README's table; an invalid value raises ``SettingsError`` naming
the variable and what it accepts.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from fastt.cluster.spec import ClusterSpec, from_tf_config, parse_cluster_spec
from fastt.errors import ClusterError, FasttError
from fastt.plugin import budget, cache
from fastt.sched.registry import DEFAULT, names

_TRUE = ("1", "true", "on", "yes")
_FALSE = ("", "0", "false", "off", "no")
LOCAL_CPU = "/job:localhost/replica:0/task:0/device:CPU:{}"


class SettingsError(FasttError):
    """An environment variable of fastt has a value fastt cannot use."""


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None:
        return default
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise SettingsError(f"{name}={raw!r}: expected 1/0 (or true/false, on/off, yes/no)")


def _auto_flag(env: Mapping[str, str], name: str) -> str:
    """``auto`` (the default), ``on`` or ``off`` (a flag's other spellings too)."""
    raw = env.get(name, "").strip().lower()
    if raw in ("", "auto"):
        return "auto"
    try:
        return "on" if _flag(env, name, True) else "off"
    except SettingsError:
        raise SettingsError(f"{name}={env[name]!r}: expected auto, on or off") from None


def _number(env: Mapping[str, str], name: str, default: float, parse: type,
            ok: Callable[[float], bool], expected: str) -> Any:
    """``env[name]`` read by ``parse`` (``default`` when unset); ``expected`` names what
    ``ok`` accepts, in the error."""
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        v = parse(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: expected {expected}") from None
    if not ok(v):
        raise SettingsError(f"{name}={raw!r}: expected {expected}")
    return v


def _count(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    return int(_number(env, name, default, int, lambda v: v >= minimum,
                       f"a whole number >= {minimum}"))


def _real(env: Mapping[str, str], name: str, default: float, high: float, expected: str
          ) -> float:
    """A number in [0, ``high``) from ``env[name]``; ``expected`` names the range in errors."""
    return float(_number(env, name, default, float, lambda v: 0.0 <= v < high, expected))


# a job name as TensorFlow takes it (``fastt.cluster.spec.JOB_NAME``)
_DEVICE = re.compile(r"^(/job:[A-Za-z][A-Za-z0-9_]*(/replica:\d+)?(/task:\d+)?)?"
                     r"/device:(CPU|GPU):\d+$", re.IGNORECASE)


def parse_devices(raw: str) -> tuple[list[str], int]:
    """``FASTT_DEVICES``: ``cpu:N`` (N logical CPU devices in this process) or a comma list
    of device names. Returns (device names, logical CPUs the inner sessions need)."""
    text = raw.strip()
    m = re.fullmatch(r"cpu:(\d+)", text, re.IGNORECASE)
    if m:
        n = int(m.group(1))
        if n < 1:
            raise SettingsError(f"FASTT_DEVICES={raw!r}: cpu:N needs N >= 1")
        return [LOCAL_CPU.format(i) for i in range(n)], n
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise SettingsError(f"FASTT_DEVICES={raw!r}: expected cpu:N or a comma list of "
                            "device names such as /device:GPU:0,/device:GPU:1")
    bad = [n for n in names if not _DEVICE.match(n)]
    if bad:
        raise SettingsError(f"FASTT_DEVICES={raw!r}: {bad[0]!r} is not a device name "
                            "(expected e.g. /device:GPU:0 or /job:worker/task:1/device:CPU:0)")
    if len(set(names)) != len(names):
        raise SettingsError(f"FASTT_DEVICES={raw!r}: a device is listed twice")
    from fastt.devices import canonical
    full = [canonical(n) for n in names]
    cpus = [int(n.rsplit(":", 1)[1]) for n in full
            if "/device:CPU:" in n and n.startswith("/job:localhost/")]
    return full, (max(cpus) + 1 if cpus else 1)


@dataclass(frozen=True)
class Settings:
    enabled: bool = False
    devices: list[str] = field(default_factory=list)  # empty: decided from the machine
    logical_cpus: int = 1
    strategy: str = DEFAULT
    bucket_mb: float = 25.0  # the ring all-reduce's gradient buckets
    device_memory_mb: float = math.inf  # what each device may hold, as fastt plans it
    # what TensorFlow's CPU allocator holds at most in this process, shared by its CPU
    # devices (TF_CPU_BFC_MEM_LIMIT_IN_MB, read as TensorFlow reads it)
    cpu_allocator_mb: float = math.inf
    transfer_priorities: str = "auto"  # weight transfers ordered by need: auto, on, off
    dump_dir: str = ""
    warmup_steps: int = 5
    profile_steps: int = 3
    measure_steps: int = 20
    measure_seconds: float = 1.0  # the least a sample spans where the machine's load is read
    max_rounds: int = 3
    reprofile_every: int = 500  # steps; 0: never
    replan_threshold: float = 0.1  # relative change of the cost models that triggers a re-plan
    order: bool = True
    split: bool = True
    rollback: bool = True  # False: a strategy measured slower stays active (trying one out)
    strict: bool = False
    verify: bool = False  # each strategy's first step checked against the original graph's
    verify_report: str = ""  # a file each check is appended to (FASTT_VERIFY_REPORT)
    # snapshots and replay to survive a lost device (FASTT_ELASTIC): auto (on a cluster),
    # on, off; the feeds kept for the replay, at most (FASTT_REPLAY_MB)
    elastic: str = "auto"
    replay_mb: float = 256.0
    overhead_fraction: float = 0.03  # fastt's own cost: this share of the run so far ...
    overhead_s: float = 2.0  # ... plus these seconds (both infinite: no limit)
    cache_dir: str = ""  # the plan cache (FASTT_CACHE_DIR; "": off)
    # a plan not computed by then is waited for while the training steps go on
    plan_wait_s: float = 1.0
    log_level: str = "INFO"
    cluster: ClusterSpec | None = None  # FASTT_CLUSTER or TF_CONFIG: sessions run there


def _cluster(env: Mapping[str, str]) -> ClusterSpec | None:
    try:
        if env.get("FASTT_CLUSTER", "").strip():
            return parse_cluster_spec(env["FASTT_CLUSTER"])
        if env.get("TF_CONFIG", "").strip():
            return from_tf_config(env["TF_CONFIG"])
    except ClusterError as e:
        name = "FASTT_CLUSTER" if env.get("FASTT_CLUSTER", "").strip() else "TF_CONFIG"
        raise SettingsError(str(e) if str(e).startswith(name) else f"{name}: {e}") from None
    return None


def _overhead(env: Mapping[str, str]) -> tuple[float, float]:
    raw = env.get("FASTT_OVERHEAD", "").strip()
    if not raw:
        return 0.03, 2.0
    try:
        return budget.parse(raw)
    except ValueError:
        raise SettingsError(f"FASTT_OVERHEAD={raw!r}: expected a share of the run and seconds "
                            "(3%+2s, 5%, 10s) or off") from None


def _cpu_allocator_mb(env: Mapping[str, str]) -> float:
    """The limit TensorFlow's CPU allocator enforces in this process: the BFC allocator's
    ``TF_CPU_BFC_MEM_LIMIT_IN_MB`` when ``TF_CPU_ALLOCATOR_USE_BFC`` turns it on (TensorFlow
    reads both when the process starts); unbounded otherwise."""
    if env.get("TF_CPU_ALLOCATOR_USE_BFC", "").strip().lower() not in ("1", "true"):
        return math.inf
    return float(_number(env, "TF_CPU_BFC_MEM_LIMIT_IN_MB", math.inf, int, lambda v: v > 0,
                         "a whole number of megabytes > 0"))


def from_env(env: Mapping[str, str] | None = None) -> Settings:
    """The settings in ``env`` (default: ``os.environ``)."""
    env = os.environ if env is None else env
    enabled = _flag(env, "FASTT", False)
    devices: list[str] = []
    cpus = 1
    if env.get("FASTT_DEVICES", "").strip():
        devices, cpus = parse_devices(env["FASTT_DEVICES"])
    cluster = _cluster(env)
    if cluster is not None and any(d.startswith("/job:localhost/") for d in devices):
        raise SettingsError(f"FASTT_DEVICES={env['FASTT_DEVICES']!r} names devices of this "
                            "process, but the sessions run on the cluster (FASTT_CLUSTER or "
                            "TF_CONFIG): leave FASTT_DEVICES unset to use every device of the "
                            "cluster, or list cluster devices (/job:worker/task:1/device:CPU:0)")
    strategy = env.get("FASTT_STRATEGY", DEFAULT).strip().lower() or DEFAULT
    if strategy not in names():
        raise SettingsError(f"FASTT_STRATEGY={env['FASTT_STRATEGY']!r}: expected one of "
                            f"{', '.join(names())} (in any case)")
    level = env.get("FASTT_LOG_LEVEL", "INFO").strip().upper() or "INFO"
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise SettingsError(f"FASTT_LOG_LEVEL={env['FASTT_LOG_LEVEL']!r}: expected DEBUG, INFO, "
                            "WARNING or ERROR (in any case)")
    fraction, fixed = _overhead(env)
    report = env.get("FASTT_VERIFY_REPORT", "").strip()
    cache_dir = (env.get("FASTT_CACHE_DIR", "").strip() or cache.default_dir(env)) \
        if _flag(env, "FASTT_CACHE", True) else ""
    return Settings(
        cache_dir=cache_dir, overhead_fraction=fraction, overhead_s=fixed, enabled=enabled,
        devices=devices,
        logical_cpus=cpus, strategy=strategy,
        bucket_mb=_real(env, "FASTT_BUCKET_MB", 25.0, float("inf"), "megabytes >= 0"),
        device_memory_mb=float(_number(env, "FASTT_DEVICE_MEMORY_MB", math.inf, float,
                                       lambda v: 0 < v < math.inf, "megabytes > 0")),
        cpu_allocator_mb=_cpu_allocator_mb(env),
        transfer_priorities=_auto_flag(env, "FASTT_TRANSFER_PRIORITIES"),
        dump_dir=env.get("FASTT_DUMP_DIR", "").strip(),
        warmup_steps=_count(env, "FASTT_WARMUP_STEPS", 5, 2),
        profile_steps=_count(env, "FASTT_PROFILE_STEPS", 3, 1),
        measure_steps=_count(env, "FASTT_MEASURE_STEPS", 20, 3),
        measure_seconds=_real(env, "FASTT_MEASURE_SECONDS", 1.0, float("inf"), "seconds >= 0"),
        max_rounds=_count(env, "FASTT_MAX_ROUNDS", 3, 1),
        reprofile_every=_count(env, "FASTT_REPROFILE_EVERY", 500, 0),
        replan_threshold=_real(env, "FASTT_REPLAN_THRESHOLD", 0.1, 1.0, "a fraction in [0, 1)"),
        order=_flag(env, "FASTT_ORDER", True), split=_flag(env, "FASTT_SPLIT", True),
        rollback=_flag(env, "FASTT_ROLLBACK", True),
        strict=_flag(env, "FASTT_STRICT", False),
        verify=_flag(env, "FASTT_VERIFY", False) or bool(report),
        verify_report=report,
        elastic=_auto_flag(env, "FASTT_ELASTIC"),
        replay_mb=_real(env, "FASTT_REPLAY_MB", 256.0, float("inf"), "megabytes >= 0"),
        log_level=level, cluster=cluster)
