"""fastt on TensorFlow's gRPC runtime: ``fastt cluster up | status | down``, an unchanged example
trained over a 2-worker local cluster, and a worker killed mid-training."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from fastt.cluster import LocalCluster, from_tf_config, parse_cluster_spec
from fastt.errors import ClusterError
from fastt.plugin.settings import SettingsError, from_env
from tests.helpers import ROOT, example_command, run

pytest.importorskip("tensorflow")


def fastt_cli(*args, state):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", "fastt.cli", "cluster", *args, "--state",
                           str(state)], env=env, capture_output=True, text=True, timeout=120)


def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def listening_addresses(port):
    """Local addresses of the sockets listening on ``port``, as /proc/net writes them."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.append(address)
    return found


LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}


def test_cluster_up_status_down_leaves_no_process(tmp_path):
    state = tmp_path / "cluster.json"
    up = fastt_cli("up", "--workers", "2", state=state)
    pids = [w["pid"] for w in json.loads(state.read_text())["workers"]] if state.exists() else []
    try:
        assert up.returncode == 0, up.stderr
        spec = re.fullmatch(r"FASTT_CLUSTER=(\S+)\n", up.stdout).group(1)
        addresses = parse_cluster_spec(spec).tasks
        assert len(pids) == 2 and all(running(p) for p in pids)
        for t in addresses:  # 127.0.0.1 only, never every interface
            port = int(t.address.rsplit(":", 1)[1])
            assert listening_addresses(port) and set(listening_addresses(port)) <= LOOPBACK
        cores = [os.sched_getaffinity(p) for p in pids]  # one core each, its own if it can
        assert all(len(c) == 1 for c in cores)
        assert cores[0] != cores[1] or len(os.sched_getaffinity(0)) < 2
        status = fastt_cli("status", state=state)
        assert status.returncode == 0 and status.stdout.count("answering (") == 2, status.stdout
        again = fastt_cli("up", state=state)
        assert again.returncode == 2 and "already up" in again.stderr
        busy_port = int(addresses[1].address.rsplit(":", 1)[1])
        busy = fastt_cli("up", "--workers", "1", "--port", str(busy_port),
                         state=tmp_path / "other.json")
        assert busy.returncode == 2 and f"[{busy_port}]" in busy.stderr and "busy" in busy.stderr
        # 'fastt cluster kill': a worker that stops answering, resumes, then is lost
        stopped = fastt_cli("kill", "1", "--signal", "STOP", state=state)
        assert stopped.returncode == 0 and f"SIGSTOP to worker 1 {addresses[1].address}" in \
            stopped.stdout, stopped.stderr
        status = fastt_cli("status", state=state)
        assert status.returncode == 1 and "running, not answering" in status.stdout
        assert fastt_cli("kill", "1", "--signal", "CONT", state=state).returncode == 0
        assert fastt_cli("status", state=state).returncode == 0
        assert fastt_cli("kill", "1", state=state).returncode == 0
        deadline = time.monotonic() + 30
        while running(pids[1]):  # a hang guard, not a timing
            assert time.monotonic() < deadline
            time.sleep(0.05)
        status = fastt_cli("status", state=state)
        assert status.returncode == 1 and "not running" in status.stdout, status.stdout
        for bad, says in ((["7"], "no worker 7"), (["1"], "is not running"), ([], "index"),
                          (["0", "--signal", "HUP"], "expected one of KILL")):
            out = fastt_cli("kill", *bad, state=state)
            assert out.returncode == 2 and says in out.stderr, (bad, out.stderr)
        # 'fastt cluster restart': the dead worker again at its address, recorded
        for bad, says in ((["0"], "still running"), (["7"], "no worker 7"), ([], "index")):
            out = fastt_cli("restart", *bad, state=state)
            assert out.returncode == 2 and says in out.stderr, (bad, out.stderr)
        back = fastt_cli("restart", "1", state=state)
        assert back.returncode == 0 and f"worker 1 {addresses[1].address}" in back.stdout, \
            back.stderr
        pids.append(json.loads(state.read_text())["workers"][1]["pid"])
        assert pids[2] != pids[1] and running(pids[2])
        port = int(addresses[1].address.rsplit(":", 1)[1])
        assert listening_addresses(port) and set(listening_addresses(port)) <= LOOPBACK
        status = fastt_cli("status", state=state)
        assert status.returncode == 0 and status.stdout.count("answering (") == 2, status.stdout
    finally:
        down = fastt_cli("down", state=state)
    assert down.returncode == 0 and "stopped 2 worker(s)" in down.stdout, down.stderr
    assert pids and not any(running(p) for p in pids)
    assert not state.exists()
    assert fastt_cli("status", state=state).returncode == 1


def test_cluster_specs_and_settings():
    spec = from_tf_config('{"cluster": {"worker": ["h1:2222", "h2:2222"], "chief": ["h0:2222"]},'
                          ' "task": {"type": "chief", "index": 0}}')
    assert spec.target == "grpc://h0:2222"
    assert [t.device_prefix for t in spec.tasks] == [
        "/job:chief/replica:0/task:0", "/job:worker/replica:0/task:0",
        "/job:worker/replica:0/task:1"]
    s = from_env({"FASTT": "1", "FASTT_CLUSTER": "127.0.0.1:2222,127.0.0.1:2223"})
    assert s.cluster.target == "grpc://127.0.0.1:2222" and len(s.cluster.tasks) == 2
    assert from_env({"TF_CONFIG": '{"cluster": {"worker": ["a:1"]}}'}).cluster.value == "a:1"
    with pytest.raises(SettingsError, match="FASTT_CLUSTER.*'localhost' is not host:port"):
        from_env({"FASTT_CLUSTER": "127.0.0.1:2222,localhost"})
    with pytest.raises(SettingsError, match="TF_CONFIG is not JSON"):
        from_env({"TF_CONFIG": "{worker"})
    with pytest.raises(SettingsError, match="TF_CONFIG has no 'cluster'"):
        from_env({"TF_CONFIG": '{"task": {}}'})
    with pytest.raises(SettingsError, match="FASTT_DEVICES='cpu:2' names devices of this"):
        from_env({"FASTT_CLUSTER": "127.0.0.1:2222", "FASTT_DEVICES": "cpu:2"})
    with pytest.raises(ClusterError, match="listed twice"):
        parse_cluster_spec("a:1,a:1")


@pytest.mark.parametrize("order, target, built, expected", [
    (True, "grpc://127.0.0.1:2222", True, "control-dependencies"),
    (True, "", True, "priority-executor"),
    (True, "", False, "control-dependencies"),
    (False, "grpc://127.0.0.1:2222", True, "none"),
])
def test_how_an_order_is_kept(monkeypatch, order, target, built, expected):
    from types import SimpleNamespace

    from fastt.plugin.backend import PluginBackend
    from tf_patches import priority_executor
    monkeypatch.setattr(priority_executor, "load", lambda: built)
    backend = SimpleNamespace(settings=SimpleNamespace(order=order),
                              plugin=SimpleNamespace(target=target))
    assert PluginBackend.order_mechanism(backend) == expected


def test_example_trains_on_a_two_worker_cluster(tmp_path):
    # Each worker runs one intra-op thread; the local reference runs on one core, which gives
    # TensorFlow's kernels the same reduction order.
    plain_loss, _, _ = run("session_feed_dict.py", tmp_path, fastt=False, cores={0})
    with LocalCluster(workers=2) as cluster:
        loss, out, err = run("session_feed_dict.py", tmp_path, fastt=True,
                             fastt_env={"FASTT_CLUSTER": cluster.spec})
        assert all(cluster.alive())
    assert loss == pytest.approx(plain_loss, rel=1e-3)
    # strategy 1 trained and was measured (the run may close before the A-B-A decision)
    assert re.search(r"planning over 2 devices", err) and re.search(
        r"fastt: ((activated|rolled back) strategy 1 \(|left strategy 1 \([^)]*\) "
        r"unfinished: measured)", err), err[-3000:]
    dumps = sorted((tmp_path / "dump").glob("strategy-*"))
    assert dumps, err[-3000:]
    doc = json.loads((dumps[0] / "strategy.json").read_text())
    assert doc["devices"] == [cluster.device(0), cluster.device(1)]
    # workers ignore executor plugins: a kept order is control dependencies; a plan predicted
    # faster in TensorFlow's own order runs without any (Engine.plan)
    assert doc["order_mechanism"] == ("control-dependencies" if doc["ordered"] else "none")
    comm = json.loads((dumps[-1] / "cost_models.json").read_text())["comm"]
    fits = {(f["src"], f["dst"]): f for f in comm["fits"]}
    for pair in ((cluster.device(0), cluster.device(1)), (cluster.device(1), cluster.device(0))):
        assert pair in fits and fits[pair]["slope_s_per_byte"] > 0, fits


def test_a_killed_master_is_named_within_seconds_and_the_script_ends_cleanly(tmp_path):
    """Without recovery (``FASTT_ELASTIC=0``), worker 0 hosts the session's master: once it
    is killed, the step blocks (TensorFlow retries the master until the step's deadline), but
    the loss is said within seconds and the step given up; the script then ends with the
    error naming it, leaving its ``with`` block without a minute of ``CloseSession``
    retries, and without an abort."""
    with LocalCluster(workers=2) as cluster:
        args, env = example_command("monitored_tf_data.py", tmp_path, fastt=True,
                                    fastt_env={"FASTT_CLUSTER": cluster.spec,
                                               "FASTT_ELASTIC": "0",
                                               # one plan, kept: the kill lands in a step,
                                               # not in building a next trial
                                               "FASTT_STRATEGY": "data-parallel",
                                               "FASTT_MAX_ROUNDS": "1",
                                               "FASTT_ROLLBACK": "0"},
                                    extra=["--steps", "10000000"])
        log_path = tmp_path / "stderr.log"
        with open(log_path, "w") as log:
            p = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=log)
        named = re.compile(r"worker 0 \(" + re.escape(cluster.addresses[0]) +
                           r", /job:worker/replica:0/task:0\) does not answer")
        try:
            deadline = time.monotonic() + 300
            while not re.search(r"fastt: activated strategy 1 \(", log_path.read_text()):
                assert p.poll() is None and time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.2)
            time.sleep(2.0)  # steps on the kept plan
            os.kill(cluster.procs[0].pid, signal.SIGKILL)
            killed = time.monotonic()
            while not named.search(log_path.read_text()):  # a hang guard, not a timing
                assert time.monotonic() - killed < 60, log_path.read_text()[-3000:]
                time.sleep(0.2)
            try:
                code = p.wait(timeout=240)  # a hang guard, not a timing
            except subprocess.TimeoutExpired:
                pytest.fail("still running 240 s after the kill: " + log_path.read_text()[-3000:])
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    err = log_path.read_text()
    assert code == 1, (code, err[-3000:])  # the script's error, not a signal
    assert re.search(r"WorkerLostError: .*worker 0 \(", err), err[-3000:]
    # the step was given up once the loss was found, not left to TensorFlow's deadline
    assert "UnavailableError" in err and "while the run waited" in err, err[-3000:]
    # What the script saved before is intact.
    import tensorflow as tf
    checkpoint = tf.train.latest_checkpoint(str(tmp_path / "fastt"))
    reader = tf.train.load_checkpoint(checkpoint)
    assert "global_step" in reader.get_variable_to_shape_map()
    assert reader.get_tensor("dense0/kernel").shape == (64, 256)


def test_sessions_of_a_cluster_that_lost_a_server_close_without_calling_it(monkeypatch):
    """``hook.forsake``: closing such a session makes no ``CloseSession`` call (which
    retries a lost master for a minute); the session is closed as far as Python is
    concerned."""
    from tf_patches import session_hook as hook
    tf1 = pytest.importorskip("tensorflow").compat.v1
    calls = []
    monkeypatch.setattr(hook, "_forsaken", {})
    monkeypatch.setitem(hook._original, "close", lambda s: calls.append(s))
    sess = tf1.Session(graph=tf1.Graph())
    sess._fastt_created = next(hook._created)
    hook.forsake(sess.sess_str)
    hook._close(sess)
    assert calls == [] and sess._closed
    # a session opened after (on the servers left) closes as usual
    later = tf1.Session(graph=tf1.Graph())
    later._fastt_created = next(hook._created)
    hook._close(later)
    assert calls == [later]
    other = tf1.Session(graph=tf1.Graph(), target="")
    other._fastt_created = next(hook._created)
    monkeypatch.setattr(hook, "_forsaken", {b"grpc://127.0.0.1:1": next(hook._created)})
    hook._close(other)
    assert calls == [later, other]


CLIENT = """
import os, sys
import tensorflow as tf
tf1 = tf.compat.v1
tf1.disable_eager_execution()
with tf.device("/job:worker/task:0/device:CPU:0"):
    c = tf.constant(1.0) + 1.0
cfg = tf1.ConfigProto(operation_timeout_in_ms=8000)
try:
    with tf1.Session("grpc://" + sys.argv[1], config=cfg) as s:
        print("ran", s.run(c, options=tf1.RunOptions(timeout_in_ms=8000)))
except tf.errors.OpError as e:
    print("refused", type(e).__name__)
"""


def _as_user(uid):
    """A command's prefix that runs it as ``uid`` (util-linux's setpriv)."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0 or
                    shutil.which("setpriv") is None,
                    reason="running a client as another local user needs root and setpriv")
def test_workers_refuse_another_local_users_connections():
    """TensorFlow's gRPC servers have no authentication: a worker of `fastt cluster up`
    accepts connections from its own user's sockets only (the loopback shim)."""
    nobody = 65534
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2", "HOME": "/tmp",
           "MPLCONFIGDIR": "/tmp"}
    with LocalCluster(workers=1) as cluster:
        def client(prefix=()):
            p = subprocess.run([*prefix, sys.executable, "-c", CLIENT, cluster.addresses[0]],
                               env=env, cwd="/", capture_output=True, text=True, timeout=300)
            return p.stdout.strip().splitlines()[-1:] or [p.stderr[-500:]]
        assert client(_as_user(nobody)) == ["refused DeadlineExceededError"]
        assert client() == ["ran 2.0"]  # its own user: served
