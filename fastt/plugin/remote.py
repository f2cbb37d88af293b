"""The plugin on a TensorFlow cluster (``FASTT_CLUSTER`` or ``TF_CONFIG``).

The user's local sessions (target ``""``) are pointed at the cluster's master with isolated
session state, as a local session's state is its own; fastt plans over every task's devices
and drives them from this one client (in-graph, as FastT did).
"""
from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from fastt.cluster.spec import ClusterSpec

_tf1 = tf.compat.v1
# What a lost or hung server makes a step fail with.
STEP_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
               tf.errors.AbortedError, tf.errors.InternalError, tf.errors.UnknownError,
               tf.errors.CancelledError)


def retarget(spec: ClusterSpec) -> Callable[[str, Any], tuple[str, Any]]:
    """The session hook's ``retarget``: a local session runs on the cluster instead."""
    def to_cluster(target: Any, config: Any) -> tuple[Any, Any]:
        if target:  # the script chose its own server: leave it
            return target, config
        cfg = _tf1.ConfigProto()
        if config is not None:
            cfg.CopyFrom(config)
        cfg.isolate_session_state = True
        return spec.target, cfg
    return to_cluster


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
