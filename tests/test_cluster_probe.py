"""The active probe on a live 2-worker TensorFlow gRPC cluster on 127.0.0.1."""
import os

import pytest

pytest.importorskip("tensorflow")

from fastt.adapters.probe import DEFAULT_SIZES, LARGE_SIZES, probe_link, probe_pair  # noqa: E402
from fastt.adapters.probe_cpu import (probe_cpu_share, probe_reach,  # noqa: E402
                                      probe_serve_delay)
from fastt.devices import canonical  # noqa: E402
from fastt.cluster import LocalCluster, parse_cluster_spec  # noqa: E402
from fastt.cluster.local import port_is_free  # noqa: E402
from fastt.costs import CommCostModel  # noqa: E402
from fastt.errors import ClusterError  # noqa: E402


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone too
        return f.read().split()[2] == "Z"


def test_probe_fits_a_positive_slope_with_high_r2_both_ways():
    cluster = LocalCluster(workers=2)
    pids = []
    try:
        cluster.start()
        pids = [p.pid for p in cluster.procs]
        assert all(a.startswith("127.0.0.1:") for a in cluster.addresses)
        model = CommCostModel()
        model.update(probe_pair(cluster.device(1), cluster.device(0), target=cluster.target))
        probe_link(model, cluster.device(0), cluster.device(1), target=cluster.target)
        for src, dst in ((1, 0), (0, 1)):
            fit = model.fit(cluster.device(src), cluster.device(dst))
            assert fit is not None and fit.samples == len(DEFAULT_SIZES + LARGE_SIZES)
            assert fit.slope > 0, fit
            assert fit.r2 >= 0.9, fit
            # the sweep's points priced as probed, in the median: one point of a live sweep
            # may sit 20-30% off its neighbours (64 MiB at 24-52 ms over six sweeps here), and
            # the fit is made to let it (a bent sweep's exact hinge: tests/test_costs.py)
            probed = model._probed[(canonical(cluster.device(src)),
                                    canonical(cluster.device(dst)))]
            off = sorted(abs(fit.predict(n) - t) / t for n, t in probed)
            assert off[len(off) // 2] <= 0.25, (fit, sorted(probed))
        # one core per worker: gRPC's copies take the cores' time (measured 0.8-1.0 each)
        shares = model.cpu_share(cluster.device(0), cluster.device(1))
        assert all(0.0 <= v <= 1.0 for v in shares) and sum(shares) > 0.3, shares
        # and a call in a burst costs both cores some work of its own (0.02-0.04 ms
        # measured), well under the link's latency
        calls = model.burst_cpu(cluster.device(0), cluster.device(1))
        latency = model.fit(cluster.device(0), cluster.device(1)).intercept
        assert all(0.0 < v < max(latency, 1e-4) for v in calls), (calls, latency)
        # the session's own worker is the cheapest to reach; the other costs the master's
        # call to it (0.3-0.6 ms measured), far above a median's noise
        reach = probe_reach([cluster.device(0), cluster.device(1)], cluster.target)
        assert reach[canonical(cluster.device(0))] == 0.0, reach
        assert reach[canonical(cluster.device(1))] > 1e-4, reach
        # a one-core worker busy with a kernel chain takes a request late: the session's own
        # worker 2.5-3.3 ms on average here, the other 0.4-1.2
        served = probe_serve_delay([cluster.device(0), cluster.device(1)], cluster.target)
        assert set(served) == {canonical(cluster.device(k)) for k in (0, 1)}, served
        assert max(served.values()) > 2e-4, served
    finally:
        cluster.stop()
    assert pids and all(_gone(p) for p in pids)


def test_busy_port_and_bad_specs_are_refused():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        assert not port_is_free(port)
        with pytest.raises(ClusterError, match=f"{port}.*busy"):
            LocalCluster(workers=1, ports=[port]).start()
    finally:
        s.close()
    with pytest.raises(ClusterError, match="not host:port"):
        parse_cluster_spec("127.0.0.1:2222,localhost")
    with pytest.raises(ClusterError, match="no worker"):
        parse_cluster_spec(" , ")
    with pytest.raises(ClusterError, match="at least one worker"):
        LocalCluster(workers=0)


def test_a_worker_that_stops_answering_is_named_within_the_deadline():
    from fastt.cluster.health import Watch
    from fastt.errors import WorkerLostError
    import signal
    import time
    with LocalCluster(workers=2) as cluster:
        watch = Watch(cluster.cluster_spec, interval=60.0, timeout=2.0)
        watch.check()  # both answer
        watch.check()  # within the interval: not asked again
        os.kill(cluster.procs[1].pid, signal.SIGSTOP)  # alive, but not answering
        try:
            t0 = time.monotonic()
            with pytest.raises(WorkerLostError, match=r"worker 1 \(" + cluster.addresses[1] +
                               r", /job:worker/replica:0/task:1\) does not answer "
                               r"\(DEADLINE_EXCEEDED"):
                watch.check(force=True)
            assert time.monotonic() - t0 < 10
        finally:
            os.kill(cluster.procs[1].pid, signal.SIGCONT)


def test_devices_of_one_process_have_no_cpu_share_to_probe():
    import tensorflow as tf
    config = tf.compat.v1.ConfigProto(device_count={"CPU": 2})
    cpu = "/job:localhost/replica:0/task:0/device:CPU:{}".format
    assert probe_cpu_share(cpu(0), cpu(1), 1e-3, config=config) is None
    # nothing to request: TensorFlow hands the tensors over
    assert probe_serve_delay([cpu(0), cpu(1)], config=config) == {
        canonical(cpu(0)): 0.0, canonical(cpu(1)): 0.0}


def test_each_size_keeps_its_fastest_sample_over_the_sweeps(monkeypatch):
    from fastt.adapters import probe
    from fastt.profiler import TransferSample
    a, b = "/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:0"
    sizes = tuple(4 ** k * 1024 for k in range(6))

    def sweep(latency, bump=None):
        return [TransferSample(a, b, n, latency + n / 2e9 + (0.05 if n == bump else 0.0))
                for n in sizes]
    taken = []
    traced = True  # the sweeps' transfers were traced (devices of two processes)
    monkeypatch.setattr(probe, "_sweep",
                        lambda *args: taken.append(1) or (next(sweeps), traced))
    line = [1.2e-4 + n / 2e9 for n in sizes]
    # a burst of load through the whole first sweep; in the second, one size caught by one;
    # then each sweep one size: the fastest of each size lie on a line, no third sweep
    for first, second in ((sweep(7.7e-4), sweep(1.2e-4)),
                          (sweep(1.2e-4, bump=sizes[3]), sweep(1.2e-4, bump=sizes[5]))):
        sweeps = iter([first, second, sweep(1.3e-4)])
        taken.clear()
        got = probe.probe_pair(a, b, sizes=sizes)
        assert len(taken) == 2 and [t.seconds for t in got] == pytest.approx(line)
    # both caught on the same size: points off a line, so a third sweep
    sweeps = iter([sweep(1.2e-4, bump=sizes[5]), sweep(1.2e-4, bump=sizes[5]), sweep(1.3e-4)])
    taken.clear()
    got = probe.probe_pair(a, b, sizes=sizes)
    assert len(taken) == 3 and got[5].seconds == pytest.approx(1.3e-4 + sizes[5] / 2e9)
    assert [t.seconds for t in got[:5]] == pytest.approx(line[:5])
    # devices of one process: nothing traced, the hand-over timed as a difference; one sweep
    traced = False
    sweeps = iter([sweep(1.2e-4, bump=sizes[5]), sweep(1.2e-4)])
    taken.clear()
    got = probe.probe_pair(a, b, sizes=sizes)
    assert len(taken) == 1 and got[5].seconds == pytest.approx(0.05 + 1.2e-4 + sizes[5] / 2e9)
