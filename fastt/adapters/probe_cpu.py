"""What a step's CPUs give up, probed: the share of a transfer's time its two ends' compute
gives up, the seconds each end gives up to a call in a burst, what a step pays to reach each
device, and how late busy cores serve a request. Each is the median of repeated measurements
on the live devices (``fastt.adapters.probe`` probes the links themselves).
"""
from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Sequence

import tensorflow as tf

from fastt.adapters.runner import traced_run
from fastt.adapters.tf_import import from_tf_graph
from fastt.devices import canonical, same_process
from fastt.errors import CostModelError
from fastt.profiler import profile

log = logging.getLogger("fastt")
_tf1 = tf.compat.v1
SHARE_BYTES = 16 * 2 ** 20  # a transfer long enough for its ends' slowdown to show


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
