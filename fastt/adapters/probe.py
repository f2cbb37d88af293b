"""Active probe of a device pair: move tensors of a sweep of sizes and time each transfer.

Used where the communication model has no samples for a pair. A variable of each size lives on
the source device and a reduction on the destination reads it, so each traced step moves exactly
one tensor; the transfer samples come from the step's RunMetadata like any other profile's
(``RecvTensor`` entries across processes). Within one process TensorFlow hands tensors between
devices without tracing a transfer; there the probe times the reduction on the destination
against the same reduction on the source. Each size yields one sample, the lower quartile of
``repeats`` measurements: on shared cores single transfers vary by several times, and
interference only ever adds time.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import tensorflow as tf

from fastt.adapters.runner import traced_run
from fastt.adapters.tf_import import from_tf_graph
from fastt.errors import CostModelError
from fastt.profiler import TransferSample, profile

log = logging.getLogger("fastt")
_tf1 = tf.compat.v1

DEFAULT_SIZES = tuple(4 ** k * 1024 for k in range(8))  # 1 KiB .. 16 MiB


def probe_pair(src: str, dst: str, target: str = "", config: Any = None,
               sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 7) -> list[TransferSample]:
    """Transfer samples from ``src`` to ``dst`` (full device names) for every size, ``repeats``
    times each, through a session on ``target`` ("" = in-process) with ``config``."""
    if src == dst:
        raise CostModelError(f"probe needs two different devices, got {src!r} twice")
    g = tf.Graph()
    probes = []  # (bytes, read on dst, same read on src)
    with g.as_default():
        for n in sizes:
            elements = max(int(n) // 4, 1)
            with tf.device(src):
                var = _tf1.get_variable(f"probe_{n}", [elements], tf.float32,
                                        initializer=_tf1.zeros_initializer(), use_resource=True)
                value = var.read_value()
                local = tf.reduce_sum(value, name=f"probe_local_{n}")
            with tf.device(dst):
                remote = tf.reduce_sum(value, name=f"probe_remote_{n}")
            probes.append((elements * 4, remote, local))
        init = _tf1.global_variables_initializer()
    graph = from_tf_graph(g, name="probe")
    samples: list[TransferSample] = []
    traces = True  # until a traced step shows no transfer (devices of one process)
    with _tf1.Session(target, graph=g, config=config) as sess:
        sess.run(init)
        for nbytes, remote, local in probes:
            sess.run([remote, local])  # warm the path up once
            traced = [s.seconds for _ in range(repeats if traces else 0)
                      for s in profile(traced_run(sess, remote)[1], graph).transfers
                      if s.nbytes == nbytes and s.src != s.dst]
            traces = bool(traced)
            seconds = _lower_quartile(traced) if traced else \
                _timed_difference(sess, remote, local, repeats)
            samples.append(TransferSample(src, dst, nbytes, seconds, "probe"))
    log.debug("probed %s -> %s: %d sizes", src, dst, len(samples))
    return samples


def _lower_quartile(values: Sequence[float]) -> float:
    return sorted(values)[len(values) // 4]


def _timed_difference(sess: Any, remote: Any, local: Any, repeats: int) -> float:
    """Median wall time of the read on the destination minus the same read on the source."""
    diffs = []
    for _ in range(max(repeats, 3)):
        t0 = time.perf_counter()
        sess.run(remote)
        t1 = time.perf_counter()
        sess.run(local)
        t2 = time.perf_counter()
        diffs.append((t1 - t0) - (t2 - t1))
    return max(_lower_quartile(diffs), 0.0)
