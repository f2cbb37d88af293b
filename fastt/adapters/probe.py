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
import statistics
import time
from typing import Any, Sequence

import tensorflow as tf

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


SHARE_BYTES = 16 * 2 ** 20


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


def probe_cpu_share(src: str, dst: str, transfer_s: float, target: str = "",
                    config: Any = None, nbytes: int = SHARE_BYTES, repeats: int = 9
                    ) -> tuple[float, float] | None:
    """How much of a ``src -> dst`` transfer's time each end's compute gives up to it, as
    (sender, receiver) shares between 0 and 1; ``transfer_s``: the time of ``nbytes`` on the
    idle link (from its fit). None when the two devices share a process (TensorFlow hands the
    tensor over: nothing to share).

    A chain of matrix products runs on one end beside a read of ``nbytes`` kept on the sender,
    then beside the same read moved to the receiver (the chain about four times as long as
    the transfer, so that it covers it); the chain's slowdown over the transfer's time is that
    end's share: 0 where a NIC or spare cores move the bytes, 1 where the only core copies
    them. Only the transfer differs between the two runs: the read runs in both, and the
    receiver keeps one element."""
    g = tf.Graph()
    with g.as_default():
        with tf.device(src):
            var = _tf1.get_variable("share_probe", [max(nbytes // 4, 1)], tf.float32,
                                    initializer=_tf1.zeros_initializer(), use_resource=True)
            value = var.read_value()
            local = tf.identity(value[0], name="share_local")  # the same read, kept here
        with tf.device(dst):
            # one element of the moved tensor: the receiver's own kernel is negligible, so
            # the chain's slowdown there is the transfer's alone
            moved = tf.identity(value[0], name="share_moved")
        chains = {end: _chain(dev, f"chain_{end}") for end, dev in (("send", src),
                                                                     ("recv", dst))}
        init = _tf1.global_variables_initializer()
    graph = from_tf_graph(g, name="share_probe")
    with _tf1.Session(target, graph=g, config=config) as sess:
        sess.run(init)
        sess.run(moved)
        if not [t for t in profile(traced_run(sess, moved)[1], graph).transfers
                if t.src != t.dst]:
            return None
        shares = []
        for end, dev in (("send", src), ("recv", dst)):
            n, out = chains[end]
            for _ in range(3):  # a cold chain or channel reads low
                per_step = _chain_seconds(sess, out, {n: 10}, dev, f"chain_{end}/") / 10
                sess.run(moved)
            steps = int(min(max(4 * transfer_s / max(per_step, 1e-6), 10), 20000))
            _chain_seconds(sess, [out, moved], {n: steps}, dev, f"chain_{end}/")  # warm
            slowdown = []
            for _ in range(repeats):
                alone = _chain_seconds(sess, [out, local], {n: steps}, dev, f"chain_{end}/")
                beside = _chain_seconds(sess, [out, moved], {n: steps}, dev, f"chain_{end}/")
                slowdown.append(beside - alone)
            share = _median(slowdown) / transfer_s if transfer_s > 0 else 0.0
            shares.append(min(max(share, 0.0), 1.0))
    log.debug("CPU share of %s -> %s transfers: sender %.2f, receiver %.2f", src, dst, *shares)
    return shares[0], shares[1]


CALLS = 128  # small tensors a call probe moves in one step
LOOKS = 3  # times a call probe measures an end again while its slowdown is not above 0


def probe_call_cpu(src: str, dst: str, target: str = "", config: Any = None,
                   calls: int = CALLS, repeats: int = 9) -> tuple[float, float]:
    """The (sender, receiver) seconds of compute a ``src -> dst`` transfer's call takes in a
    burst (0.02-0.04 ms at each end measured between two single-core workers here, against
    0.07 for a call alone and a latency of 0.13).

    ``calls`` 1 KiB variables on ``src`` are each reduced on ``dst`` in one step, beside a
    chain of matrix products on the end measured; the control is the same ops all on that end
    (the same kernels, no transfer). The chain's slowdown over the control, per transfer, is
    what a call takes from that end."""
    g = tf.Graph()
    with g.as_default():
        def reduced(home: str, where: str, tag: str) -> Any:
            sums = []
            for k in range(calls):
                with tf.device(home):
                    var = _tf1.get_variable(f"{tag}_{k}", [256], tf.float32,
                                            initializer=_tf1.zeros_initializer(),
                                            use_resource=True)
                    value = var.read_value()
                with tf.device(where):
                    sums.append(tf.reduce_sum(value))
            with tf.device(where):
                return tf.add_n(sums)
        moved = reduced(src, dst, "call_probe")
        local = {"send": reduced(src, src, "call_send"), "recv": reduced(dst, dst, "call_recv")}
        chains = {end: _chain(dev, f"chain_{end}") for end, dev in (("send", src),
                                                                     ("recv", dst))}
        init = _tf1.global_variables_initializer()
    seconds = []
    with _tf1.Session(target, graph=g, config=config) as sess:
        sess.run(init)
        for fetch in (moved, *local.values()):
            sess.run(fetch)
        took = _median([_timed(sess, moved) for _ in range(3)])
        for end, dev in (("send", src), ("recv", dst)):
            n, out = chains[end]
            prefix = f"chain_{end}/"
            per_step = _chain_seconds(sess, out, {n: 10}, dev, prefix) / 10
            # a chain twice as long as the transfers alone take: it covers them, and its own
            # noise (a few % of its length) stays small against their work
            feed = {n: int(min(max(2 * took / max(per_step, 1e-6), 10), 20000))}
            _chain_seconds(sess, [out, moved], feed, dev, prefix)  # warm
            for _ in range(LOOKS):
                # a call takes something from both ends: a median at or below 0 is the
                # host's noise beside the chain (seen once in a run with 1-7% steal), so
                # it is measured again
                slowdown = _median([_chain_seconds(sess, [out, moved], feed, dev, prefix)
                                    - _chain_seconds(sess, [out, local[end]], feed, dev,
                                                     prefix)
                                    for _ in range(repeats)])
                if slowdown > 0:
                    break
            seconds.append(max(slowdown / calls, 0.0))
    log.debug("CPU seconds of a %s -> %s call in a burst: sender %.1f us, receiver %.1f us",
              src, dst, 1e6 * seconds[0], 1e6 * seconds[1])
    return seconds[0], seconds[1]


def _timed(sess: Any, fetch: Any) -> float:
    t = time.perf_counter()
    sess.run(fetch)
    return time.perf_counter() - t


def _chain(device: str, scope: str) -> tuple[Any, Any]:
    """A loop of ``n`` (fed) dependent 256x256 matrix products on ``device``."""
    with tf.device(device), tf.name_scope(scope):
        n = _tf1.placeholder(tf.int32, [], name="n")
        w = tf.random.stateless_normal([256, 256], seed=[1, 2]) / 16.0
        a0 = tf.random.stateless_normal([256, 256], seed=[3, 4])
        _, a = tf.while_loop(lambda i, a: i < n, lambda i, a: (i + 1, tf.tanh(tf.matmul(a, w))),
                             [tf.constant(0), a0])
        return n, tf.reduce_sum(a)


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


def probe_reach(names: Sequence[str], target: str = "", config: Any = None,
                repeats: int = 100) -> dict[str, float]:
    """Seconds a step pays to run anything on each device of ``names`` beyond the cheapest of
    them, by canonical name. A step that runs on a worker other than the session's own pays
    the master's call to it (0.3-0.6 ms measured between two single-core gRPC workers here);
    devices of one process cost the same. A tiny op per device, run alone, round-robin over
    the devices ``repeats`` times; the median of each after the first fifth."""
    g = tf.Graph()
    ops = []
    with g.as_default():
        for k, name in enumerate(names):
            with tf.device(name):
                var = _tf1.get_variable(f"reach_probe_{k}", [4], tf.float32,
                                        initializer=_tf1.zeros_initializer(), use_resource=True)
                ops.append(tf.reduce_sum(var.read_value()))
        init = _tf1.global_variables_initializer()
    times: list[list[float]] = [[] for _ in names]
    with _tf1.Session(target, graph=g, config=config) as sess:
        sess.run(init)
        for _ in range(repeats):
            for op, seen in zip(ops, times):
                t = time.perf_counter()
                sess.run(op)
                seen.append(time.perf_counter() - t)
    steps = [_median(seen[repeats // 5:]) for seen in times]
    reach = {canonical(n): s - min(steps) for n, s in zip(names, steps)}
    log.debug("a step's cost to reach each device: %s",
              ", ".join(f"{n} {1e3 * s:.3f} ms" for n, s in reach.items()))
    return reach


def probe_serve_delay(names: Sequence[str], target: str = "", config: Any = None,
                      repeats: int = 25, busy_s: float = 0.03) -> dict[str, float]:
    """Per device of ``names`` (by canonical name), how much later its cores serve a request
    for a tensor it holds when they are busy: a receiver asks when its step starts, and on a
    one-core worker gRPC's threads wait for the executor to leave the core (a data-parallel
    step's input slice waited 3.2 ms here while its sender ran a convolution). 0 for a device
    that shares its process with every other (nothing to request).

    A 16-byte read on the device is taken by an identity on another process's device, in
    traced steps: from the read's end to the identity's start, beside a chain of matrix
    products of about ``busy_s`` on the device, less the same without the chain; means of
    ``repeats`` (the wait is often a fraction of a millisecond, sometimes several: 0.2-9.6
    ms for the session's own worker here, mean 2.4-3.5; it is what a step pays on average)."""
    out: dict[str, float] = {}
    for src in names:
        dst = next((d for d in names if not same_process(src, d)), None)
        if dst is None:
            out[canonical(src)] = 0.0
            continue
        g = tf.Graph()
        with g.as_default():
            with tf.device(src):
                var = _tf1.get_variable("serve_probe", [4], tf.float32,
                                        initializer=_tf1.zeros_initializer(), use_resource=True)
                value = tf.raw_ops.ReadVariableOp(resource=var.handle, dtype=tf.float32,
                                                  name="serve_value")  # never pruned
            with tf.device(dst):
                got = tf.identity(value, name="serve_got")
            n, chain = _chain(src, "serve_chain")
            init = _tf1.global_variables_initializer()
        with _tf1.Session(target, graph=g, config=config) as sess:
            sess.run(init)
            per_step = _chain_seconds(sess, chain, {n: 10}, src, "serve_chain/") / 10
            steps = int(min(max(busy_s / max(per_step, 1e-6), 10), 20000))
            waits = {k: [_served_after(sess, [got, chain], {n: k}, src, dst)
                         for _ in range(repeats)] for k in (0, steps)}
        delay = statistics.fmean(waits[steps]) - statistics.fmean(waits[0])
        out[canonical(src)] = max(delay, 0.0)
        log.debug("a request to busy %s waits %.2f ms more", src, 1e3 * delay)
    return out


def _served_after(sess: Any, fetches: Any, feed: dict[Any, Any], src: str, dst: str) -> float:
    """In a traced run: from ``serve_value``'s end on ``src`` to ``serve_got``'s start on
    ``dst``."""
    meta = traced_run(sess, fetches, feed)[1]
    at = {(canonical(dev.device), ns.node_name): ns for dev in meta.step_stats.dev_stats
          for ns in dev.node_stats}
    value, got = at.get((canonical(src), "serve_value")), at.get((canonical(dst), "serve_got"))
    if value is None or got is None:
        raise CostModelError(f"the serve probe left no trace of its tensor on {src} or {dst}")
    return (got.all_start_micros - value.all_start_micros - value.all_end_rel_micros) / 1e6


def _chain_seconds(sess: Any, fetches: Any, feed: dict[Any, Any], device: str,
                   prefix: str) -> float:
    """First start to last end of the nodes under ``prefix`` on ``device`` in a traced run."""
    meta = traced_run(sess, fetches, feed)[1]
    spans = [(ns.all_start_micros, ns.all_start_micros + ns.all_end_rel_micros)
             for dev in meta.step_stats.dev_stats if canonical(dev.device) == canonical(device)
             for ns in dev.node_stats if ns.node_name.startswith(prefix)]
    if not spans:
        raise CostModelError(f"the CPU-share probe's chain left no trace on {device}")
    return (max(e for _, e in spans) - min(b for b, _ in spans)) / 1e6


def _median(values: Sequence[float]) -> float:
    return sorted(values)[len(values) // 2]


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
