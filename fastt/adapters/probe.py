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

from fastt.adapters.probe_cpu import (SHARE_BYTES, probe_call_cpu, probe_cpu_share, probe_reach,
                                     probe_serve_delay)
from fastt.adapters.runner import traced_run
from fastt.adapters.tf_import import from_tf_graph
from fastt.costs import CommCostModel, CostModels
from fastt.costs.comm import PROBED
from fastt.devices import canonical, link_class, same_process
from fastt.errors import CostModelError
from fastt.profiler import TransferSample, profile

log = logging.getLogger("fastt")
_tf1 = tf.compat.v1

DEFAULT_SIZES = tuple(4 ** k * 1024 for k in range(8))  # 1 KiB .. 16 MiB
# between processes, beyond: where a transfer's cost per byte may grow (``fastt.costs.comm``)
LARGE_SIZES = (32 * 2 ** 20, 64 * 2 ** 20)
LINEAR = 0.9  # r2 of a sweep's points that lie on a line; below, a sweep more is taken
SWEEPS = 2  # the least taken: a burst of load may last a whole sweep
ATTEMPTS = 5  # the most: on a loaded host a burst may span several sweeps


def probe_pair(src: str, dst: str, target: str = "", config: Any = None,
               sizes: Sequence[int] | None = None, repeats: int = 7) -> list[TransferSample]:
    """Transfer samples from ``src`` to ``dst`` (full device names) for every size, ``repeats``
    times each, through a session on ``target`` ("" = in-process) with ``config``; default
    sizes ``DEFAULT_SIZES``, and ``LARGE_SIZES`` between processes. Each size keeps its
    fastest sample over ``SWEEPS`` sweeps (load only ever adds time): a burst of other load
    may last a whole sweep, every size then slower by the same, and a link's latency several
    times its own. While those points do not lie on a line (r2 under ``LINEAR``: a burst
    through most of one sweep's repeats), a sweep more, up to ``ATTEMPTS``; between devices of
    one process, whose hand-over is not traced, one sweep."""
    if sizes is None:
        sizes = DEFAULT_SIZES + (() if same_process(src, dst) else LARGE_SIZES)
    best: list[TransferSample] = []
    for sweep in range(ATTEMPTS):
        samples, traced = _sweep(src, dst, target, config, sizes, repeats)
        best = [min(a, b, key=lambda t: t.seconds) for a, b in zip(best, samples)] \
            if best else samples
        if not traced:
            # devices of one process: no copy is traced, and the timed difference of a read
            # on either side is noise around a hand-over that costs next to nothing; more
            # sweeps do not make it a line (a loaded host swept 5 times for seconds)
            break
        if sweep + 1 < SWEEPS:
            continue
        trial = CommCostModel()
        trial.update(best)
        fit = trial.fit(src, dst)
        r2 = fit.r2 if fit is not None else 1.0
        if r2 >= LINEAR:
            break
        log.debug("probe %s -> %s: points off a line (r2 %.2f); probing again", src, dst, r2)
    return best


def _sweep(src: str, dst: str, target: str, config: Any, sizes: Sequence[int],
           repeats: int) -> tuple[list[TransferSample], bool]:
    """One sweep of ``probe_pair``, and whether its transfers were traced (else timed as a
    difference: devices of one process)."""
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

    def transfers(remote: Any, nbytes: int) -> list[float]:
        return [s.seconds for s in profile(traced_run(sess, remote)[1], graph).transfers
                if s.nbytes == nbytes and s.src != s.dst]

    traced: dict[int, list[float]] = {nbytes: [] for nbytes, _, _ in probes}
    with _tf1.Session(target, graph=g, config=config) as sess:
        sess.run(init)
        for _, remote, local in probes:
            sess.run([remote, local])  # warm the path up once
        nbytes, remote, _ = probes[0]
        traced_any = bool(transfers(remote, nbytes))
        if traced_any:  # else devices of one process: nothing is traced
            # round-robin over the sizes: a burst of load spreads over them, not onto one
            for _ in range(repeats):
                for nbytes, remote, _ in probes:
                    traced[nbytes] += transfers(remote, nbytes)
        samples = [TransferSample(src, dst, nbytes, _lower_quartile(traced[nbytes])
                                  if traced[nbytes] else
                                  _timed_difference(sess, remote, local, repeats), PROBED)
                   for nbytes, remote, local in probes]
    log.debug("probed %s -> %s: %d sizes", src, dst, len(samples))
    return samples, traced_any




def probe_link(comm: CommCostModel, src: str, dst: str, target: str = "",
               config: Any = None) -> None:
    """Probe the ``src -> dst`` link into ``comm``: its transfer samples, then (between
    processes) the share of a transfer's time its two ends' compute gives up, and the seconds
    each gives up to a call in a burst."""
    comm.update(probe_pair(src, dst, target, config))
    fit = comm.link(src, dst)
    if fit is None or same_process(src, dst):  # one process: nothing to share (below)
        return
    shares = probe_cpu_share(src, dst, fit.predict(SHARE_BYTES), target, config)
    if shares is not None:
        calls = probe_call_cpu(src, dst, target, config)
        comm.set_cpu_share(src, dst, *shares, *calls)


def unprobed(models: CostModels, names: Sequence[str]) -> tuple[list[tuple[str, str]], bool]:
    """What ``models`` do not know yet about the devices ``names``: the pairs without a link
    fit (between devices of one process, one pair of each ``link_class``, both ways), and
    whether what a step pays to reach each device, or how late its busy cores serve a
    request, is missing."""
    links: list[tuple[str, str]] = []
    kinds = {link_class(s, d) for s in names for d in names
             if s != d and models.comm.probed(s, d)}
    for src, dst in ((s, d) for s in names for d in names if s != d):
        kind = link_class(src, dst)  # devices of one process: one pair per kind, both ways
        if kind is None:
            if models.comm.fit(src, dst) is None:
                links.append((src, dst))
        elif kind not in kinds:
            kinds.add(kind)
            links += [(src, dst), (dst, src)]
    reach = len(names) > 1 and any(canonical(d) not in models.device_step or
                                   canonical(d) not in models.serve for d in names)
    return links, reach


def probe_devices(models: CostModels, names: Sequence[str], target: str = "",
                  config: Any = None) -> None:
    """Probe into ``models`` what they do not know yet about the devices ``names``
    (``unprobed``): each such pair's link (``probe_link``) and what a step pays to reach each
    device (``probe_reach``)."""
    links, reach = unprobed(models, names)
    for src, dst in links:
        probe_link(models.comm, src, dst, target, config)
    if reach:
        models.device_step.update(probe_reach(names, target, config))
        models.serve.update(probe_serve_delay(names, target, config))


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
