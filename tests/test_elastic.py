"""Snapshots and replay (``fastt.plugin.elastic``): when to take one, what the replay keeps, and
a lost device simulated on logical CPU devices: the unchanged loop goes on, its losses step by
step those of a run that lost nothing."""
import logging
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1
tf1.disable_eager_execution()

import fastt.plugin  # noqa: E402
from fastt.cluster import LocalCluster  # noqa: E402
from fastt.errors import WorkerLostError  # noqa: E402
from fastt.plugin import activation, elastic, runtime, survive  # noqa: E402
from fastt.plugin.state import State  # noqa: E402
from tests.helpers import ROOT  # noqa: E402
from tests.plugin_helpers import build, statuses, train  # noqa: E402
from tf_patches import session_hook  # noqa: E402

LOST = "/job:localhost/replica:0/task:0/device:CPU:2"


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_snapshots_cost_at_most_their_share_of_the_step_time():
    clock = Clock()
    snaps = elastic.Snapshots(replay_bytes=1e9, clock=clock)
    snaps.restart(State())
    for _ in range(5):  # steps of 100 ms
        clock.t += 0.1
        snaps.step_ended()

    def capture():
        clock.t += 0.01  # a copy of 10 ms
        return State({"w": np.zeros(3)})
    snaps.take(capture)
    # 10 ms every 5 steps of 100 ms: 2% of the step time
    assert snaps.interval == 5
    assert snaps.capture_s == pytest.approx(0.01)
    for k in range(1, 6):
        clock.t += 0.1
        snaps.step_ended()
        assert snaps.due() == (k == 5)


def test_feeds_past_the_bound_take_a_snapshot_sooner_and_are_kept_as_fed():
    snaps = elastic.Snapshots(replay_bytes=1000)
    snaps.restart(State())
    snaps.interval = 100
    batch = np.ones((10, 10), np.float32)  # 400 bytes
    snaps.ran(["loss:0"], ["train"], {"x:0": batch})
    batch[:] = 7  # the script refills its buffer for the next step
    assert snaps.last.runs[0].feeds["x:0"].max() == 1
    snaps.step_ended()
    assert not snaps.due()
    snaps.ran(["loss:0"], ["train"], {"x:0": batch})
    snaps.ran(["loss:0"], ["train"], {"x:0": batch})
    snaps.step_ended()
    assert snaps.last.nbytes == 1200 and snaps.due()


def _lose_at(monkeypatch, after_runs=4, lost=(LOST,)):
    """The first run served after ``after_runs`` runs on a plan that uses ``LOST`` fails
    once, after it ran (its updates applied, as when a server dies before answering), and
    ``lost`` are lost from then on."""
    serve, seen = activation.Running.serve, {"runs": 0, "failed": None}

    def uses_lost(running):
        s = running.strategy
        return s is not None and LOST in set(s.placement.values())

    def failing(self, *a, **kw):
        out = serve(self, *a, **kw)
        if seen["failed"] is None and uses_lost(self):
            seen["runs"] += 1
            if seen["runs"] > after_runs:
                seen["failed"] = self
                raise tf.errors.UnavailableError(None, None, "Socket closed (simulated)")
        return out
    monkeypatch.setattr(activation.Running, "serve", failing)
    monkeypatch.setattr(runtime.SessionPlugin, "find_loss",
                        lambda self, devices: survive.Loss(
                            [d for d in devices if d in lost] if seen["failed"] is not None
                            else [], []))
    return seen


@pytest.mark.slow
def test_a_lost_device_costs_the_steps_since_the_snapshot_not_the_run(
        plugin, monkeypatch, tmp_path, caplog):
    _, ref, ref_seen = train(build(with_data=True), fetch_idx=True)
    seen = _lose_at(monkeypatch)
    plugin(devices=[f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(3)],
           logical_cpus=3, elastic="on", max_rounds=3)
    caplog.set_level(logging.INFO, logger="fastt")
    m = build(with_data=True)
    sess, losses, order = train(m, fetch_idx=True)
    p = session_hook.plugin_of(sess)
    assert seen["failed"] is not None, "no plan over the third device ran"
    # every step returned, with the values of a run that lost nothing, in the same order
    np.testing.assert_allclose(losses, ref, rtol=1e-4)
    assert order == ref_seen
    said = [r.getMessage() for r in caplog.records if "lost at step" in r.getMessage()]
    assert len(said) == 1 and LOST in said[0] and "replayed" in said[0]
    assert LOST not in [d.name for d in p.engine.devices]
    running = p.current.strategy
    assert running is not None and LOST not in set(running.placement.values())
    dumps = {d["n"]: d for d in statuses(tmp_path).values()}
    lost = [d for d in dumps.values() if d["status"] == "lost"]
    kept = [d for d in dumps.values() if "lost at step" in d["reason"]
            and d["status"] == "active"]
    assert len(lost) == 1 and len(kept) == 1
    # the script's own checkpoint, saved through fastt after the recovery, restores without it
    path = m.saver.save(sess, str(tmp_path / "ckpt" / "model"))
    values = sess.run(tf1.global_variables())
    sess.close()
    fastt.plugin.uninstall()
    with tf1.Session(graph=m.g) as plain:
        m.saver.restore(plain, path)
        for a, b in zip(plain.run(tf1.global_variables()), values):
            np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_a_device_lost_while_fastt_starts_a_trial_costs_the_trial_not_the_run(
        plugin, monkeypatch, tmp_path, caplog):
    """The device is lost while fastt starts its next graph to try (or the graph to roll
    back to), after a plan over it ran: the trial ends unfinished, training goes on from the
    snapshot without the device."""
    _, ref, ref_seen = train(build(with_data=True), fetch_idx=True)
    start, seen = activation.start, {"failed": False}

    def failing(*a, **kw):
        current = a[5]
        s = current.strategy
        if not seen["failed"] and kw.get("state") is None and s is not None and \
                LOST in set(s.placement.values()):
            seen["failed"] = True
            raise tf.errors.DeadlineExceededError(None, None, "Deadline Exceeded (simulated)")
        return start(*a, **kw)
    monkeypatch.setattr(activation, "start", failing)
    monkeypatch.setattr(runtime.SessionPlugin, "find_loss", lambda self, devices: survive.Loss(
        [d for d in devices if d == LOST] if seen["failed"] else [], []))
    plugin(devices=[f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(3)],
           logical_cpus=3, elastic="on", max_rounds=3, rollback=False)
    caplog.set_level(logging.INFO, logger="fastt")
    sess, losses, order = train(build(with_data=True), fetch_idx=True)
    p = session_hook.plugin_of(sess)
    assert seen["failed"], "no second graph was started after one over the third device"
    np.testing.assert_allclose(losses, ref, rtol=1e-4)
    assert order == ref_seen
    said = [r.getMessage() for r in caplog.records if "lost at step" in r.getMessage()]
    assert len(said) == 1 and LOST in said[0] and "DeadlineExceededError" in said[0]
    # no other warning: nothing failed, nothing went back to the script's own session
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == said
    running = p.current.strategy
    assert running is not None and LOST not in set(running.placement.values())
    dumps = {d["n"]: d for d in statuses(tmp_path).values()}
    assert [d["status"] for d in dumps.values()].count("lost") == 1
    assert [d["status"] for d in dumps.values()].count("unfinished") == 1


@pytest.mark.slow
def test_the_scripts_own_session_lost_in_warm_up_goes_on_from_its_snapshot(
        plugin, monkeypatch, tmp_path, caplog):
    """Before fastt runs a graph of its own, the script's session is snapshotted too: losing
    the device it runs on (the master's, on a cluster) moves training to another device."""
    _, ref, ref_seen = train(build(with_data=True), fetch_idx=True)
    first = "/job:localhost/replica:0/task:0/device:CPU:0"
    user_run, seen = runtime.SessionPlugin._user_run, {"steps": 0, "failed": False}

    def failing(self, *a, survivable=False, **kw):
        out = user_run(self, *a, survivable=survivable, **kw)
        if survivable and self.controller is not None and not seen["failed"]:
            seen["steps"] += 1
            if seen["steps"] == 3:  # the third step after the training step was found
                seen["failed"] = True
                raise tf.errors.UnavailableError(None, None, "Socket closed (simulated)")
        return out
    monkeypatch.setattr(runtime.SessionPlugin, "_user_run", failing)
    monkeypatch.setattr(runtime.SessionPlugin, "find_loss", lambda self, devices: survive.Loss(
        [d for d in devices if d == first] if seen["failed"] else [], []))
    plugin(elastic="on", warmup_steps=5)
    caplog.set_level(logging.INFO, logger="fastt")
    sess, losses, order = train(build(with_data=True), fetch_idx=True)
    p = session_hook.plugin_of(sess)
    assert seen["failed"]
    np.testing.assert_allclose(losses, ref, rtol=1e-6)
    assert order == ref_seen
    said = [r.getMessage() for r in caplog.records if "lost at step" in r.getMessage()]
    assert len(said) == 1 and first in said[0], said
    assert p.current is not p.user and set(p.current.strategy.placement.values()) == \
        {"/job:localhost/replica:0/task:0/device:CPU:1"}


@pytest.mark.slow
def test_no_device_left_is_one_error_naming_a_checkpoint_the_saver_restores(
        plugin, monkeypatch, tmp_path):
    devices = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(3)]
    _lose_at(monkeypatch, lost=devices)
    plugin(devices=devices, logical_cpus=3, elastic="on", max_rounds=3)
    m = build(with_data=True)
    with pytest.raises(WorkerLostError, match="every device fastt planned over is lost") as e:
        train(m)
    path = str(e.value).split("TensorFlow checkpoint ", 1)[1].split(",")[0]
    fastt.plugin.uninstall()
    with tf1.Session(graph=m.g) as plain:
        m.saver.restore(plain, path)
        step = plain.run(m.step)
    assert step > 0  # the state of a step that ran, not the initial one


@pytest.mark.slow
def test_no_plan_fitting_the_devices_left_is_one_error_naming_what_is_left(
        plugin, monkeypatch, tmp_path):
    from fastt.errors import DoesNotFit
    from fastt.plugin import backend
    seen = _lose_at(monkeypatch)
    plan = backend.PluginBackend.plan

    def no_fit(self, name):
        if seen["failed"] is not None:
            raise DoesNotFit("a replica needs 3.0 GiB, the devices hold 2.0 GiB (simulated)")
        return plan(self, name)
    monkeypatch.setattr(backend.PluginBackend, "plan", no_fit)
    plugin(devices=[f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(3)],
           logical_cpus=3, elastic="on", max_rounds=3)
    m = build(with_data=True)
    with pytest.raises(WorkerLostError, match="no plan over the devices left fits their "
                       r"memory \(a replica needs .*\(left: .*CPU:0, .*CPU:1\); the training "
                       "state of step") as e:
        train(m)
    path = str(e.value).split("TensorFlow checkpoint ", 1)[1].split(",")[0]
    fastt.plugin.uninstall()
    with tf1.Session(graph=m.g) as plain:
        m.saver.restore(plain, path)
        assert plain.run(m.step) > 0


def _steps(text):
    """(step, loss) of each line the script printed."""
    return [(int(m.group(1)), float(m.group(2)))
            for m in re.finditer(r"^step (\d+) loss (\S+)", text, re.M)]


def _reference(tmp_path, steps):
    """The script's command line, its environment without fastt, and its run on one core
    (the workers' one thread)."""
    script = os.path.join(ROOT, "benchmarks", "scripts", "elastic_mlp.py")
    base = {k: v for k, v in os.environ.items() if not k.startswith("FASTT")}
    base.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
    args = [sys.executable, script, "--steps", str(steps), "--width", "256"]
    ref = subprocess.run(args + ["--out", str(tmp_path / "ref")], env=base, text=True,
                         capture_output=True, timeout=300,
                         preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    assert ref.returncode == 0, ref.stderr[-2000:]
    return args, base, ref


def _on(cluster, base, tmp_path, **extra):
    """The environment of a run with fastt on ``cluster``: one plan, kept, found soon."""
    return dict(base, FASTT="1", FASTT_CLUSTER=cluster.spec, FASTT_CACHE="0",
                FASTT_OVERHEAD="off", FASTT_ROLLBACK="0", FASTT_MAX_ROUNDS="1",
                FASTT_WARMUP_STEPS="2", FASTT_MEASURE_STEPS="3", FASTT_MEASURE_SECONDS="0",
                FASTT_DUMP_DIR=str(tmp_path / "dump"), **extra)


def _run_killing(cluster, victim, args, env, tmp_path, then=None):
    """The script run on ``cluster``, worker ``victim`` killed 10 steps after the first plan
    was activated (``then(cluster, stderr so far)`` called as it runs); its exit code,
    stdout and stderr."""
    out_path, err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        p = subprocess.Popen(args + ["--out", str(tmp_path / "fastt")], env=env, stdout=out,
                             stderr=err)
    try:
        deadline, at, killed = time.monotonic() + 500, None, False
        while p.poll() is None:  # a hang guard, not a timing
            assert time.monotonic() < deadline, err_path.read_text()[-3000:]
            time.sleep(0.1)
            text = err_path.read_text()
            if at is None and "activated strategy 1" in text:
                at = len(_steps(out_path.read_text()))
            if at is not None and not killed and len(_steps(out_path.read_text())) >= at + 10:
                os.kill(cluster.procs[victim].pid, signal.SIGKILL)
                cluster.procs[victim].wait()
                killed = True
            if killed and then is not None:
                then(cluster, text)
        code = p.wait()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    err = err_path.read_text()
    assert killed, err[-3000:]
    return code, out_path.read_text(), err


@pytest.mark.slow
def test_a_killed_master_costs_seconds_and_the_unchanged_script_runs_to_its_end(tmp_path):
    """A real kill: worker 0, which hosts the sessions' master, is killed with SIGKILL while a
    plan over both workers runs. The script's loop goes on to its end: every step printed once
    and in order, its losses those of an uninterrupted run without fastt, and its own Saver's
    checkpoints restore without fastt."""
    steps = 110
    args, base, ref = _reference(tmp_path, steps)
    with LocalCluster(workers=2) as cluster:
        code, out, err = _run_killing(cluster, 0, args, _on(cluster, base, tmp_path),
                                      tmp_path)
    assert code == 0, err[-3000:]
    said = re.findall(r"fastt: worker 0 \(.*\) lost at step \d+ \(.*replayed in", err)
    assert len(said) == 1, err[-3000:]
    got, want = _steps(out), _steps(ref.stdout)
    assert [s for s, _ in got] == list(range(steps))
    np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=1e-5)
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path / "fastt")))
    assert reader.get_tensor("global_step") == 100
    kept = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path / "ref")))
    np.testing.assert_allclose(reader.get_tensor("hidden0/kernel"),
                               kept.get_tensor("hidden0/kernel"), rtol=1e-5, atol=1e-7)


def test_a_server_a_run_was_given_up_for_stays_lost_though_it_answers_again(monkeypatch):
    """A SIGSTOPped worker resumed after its run was given up still counts as lost: the run
    left on it may yet write the old session's state, so training goes on from the snapshot
    without it."""
    from fastt.cluster import health
    from fastt.cluster.spec import parse_cluster_spec
    spec = parse_cluster_spec("127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
    asked = []
    monkeypatch.setattr(health, "unanswered",
                        lambda tasks, timeout: asked.extend(tasks) or [])  # all answer
    watch = health.Watch(spec)
    devices = [f"{t.device_prefix}/device:CPU:0" for t in spec.tasks]
    assert not survive.find_loss(watch, devices)
    asked.clear()
    stopped = spec.tasks[1]
    loss = survive.find_loss(watch, devices, given_up=[stopped])
    assert loss.devices == [devices[1]] and loss.tasks == [stopped] and not loss.master
    assert stopped not in asked  # not asked again (a stopped one answers at its timeout)
    watch.forget([stopped])
    assert not survive.find_loss(watch, devices, given_up=[stopped])


@pytest.mark.slow
def test_a_worker_that_comes_back_is_planned_over_again(tmp_path):
    """Worker 1 of two is killed while a plan over both runs: training goes on on worker 0;
    once worker 1 is restarted at its address, it is said and the next plan is over both
    again. The losses are those of an uninterrupted run without fastt, step by step (the plan
    is a model-parallel spread, which computes what the original graph does, value for value:
    over thousands of steps a replicated plan's reassociated sums grow apart from it)."""
    steps = 6000  # a few ms each: enough for a restart and a check after it
    args, base, ref = _reference(tmp_path, steps)
    restarted = []

    def restart(cluster, err):
        if not restarted and "lost at step" in err:
            cluster.restart(1)
            restarted.append(True)
    with LocalCluster(workers=2) as cluster:
        code, out, err = _run_killing(cluster, 1, args,
                                      _on(cluster, base, tmp_path, FASTT_STRATEGY="m-topo"),
                                      tmp_path, restart)
    assert code == 0 and restarted, err[-3000:]
    lost = err.index("lost at step")
    back = re.search(r"fastt: worker 1 \(.*\) answers again; the next plan takes it in", err)
    assert back and back.start() > lost, err[-3000:]
    # planned over both again (kept or passed over as its prediction says)
    assert "fastt: planned m-topo over 2 devices" in err[back.end():], err[-3000:]
    got, want = _steps(out), _steps(ref.stdout)
    assert [s for s, _ in got] == list(range(steps))
    np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=1e-5)


def test_a_server_not_answering_at_start_is_left_out_of_the_session(monkeypatch, caplog):
    """With recovery on, a session is made without a server that does not answer (it would
    wait for it, then fail); without recovery, as it is (the first run names the server)."""
    from fastt.cluster.spec import parse_cluster_spec
    from fastt.plugin import remote
    spec = parse_cluster_spec("127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
    down = spec.tasks[2]
    monkeypatch.setattr(remote, "unanswered",
                        lambda tasks, timeout: [(t, "UNAVAILABLE") for t in tasks if t == down])
    monkeypatch.setattr(remote, "_said", set())
    caplog.set_level(logging.WARNING, logger="fastt")
    target, cfg = remote.retarget(spec, "", None, elastic=True)
    assert target == spec.target and cfg.isolate_session_state
    assert list(cfg.device_filters) == [t.device_prefix for t in spec.tasks[:2]]
    assert remote.started_without() == [down]
    assert "worker 2 (127.0.0.1:3" in caplog.text and "training starts without it" in caplog.text
    remote.retarget(spec, "", None, elastic=True)
    assert caplog.text.count("training starts without it") == 1  # said once
    _, cfg = remote.retarget(spec, "", None, elastic=False)
    assert not cfg.device_filters and remote.started_without() == []
    assert remote.retarget(spec, "grpc://elsewhere:1", None, elastic=True)[0] == \
        "grpc://elsewhere:1"
