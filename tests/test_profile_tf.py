"""Profiling real training steps over 2 logical CPU devices."""
import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1
tf1.disable_eager_execution()

from fastt import zoo  # noqa: E402
from fastt.adapters.engine import Engine  # noqa: E402
from fastt.errors import FasttError  # noqa: E402
from fastt.sched.sim.problem import Device  # noqa: E402

DEVICES = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(2)]


@pytest.fixture(scope="module")
def profiled():
    model = zoo.build("small_cnn", devices=DEVICES)
    engine = Engine(model.graph, [Device(d) for d in DEVICES], [model.train_op.name])
    with tf1.Session(graph=model.graph, config=tf1.ConfigProto(device_count={"CPU": 2})) as sess:
        sess.run(model.init)
        profiles = engine.trace(sess, model.feed_dict(), steps=5, warmup=1)
    return engine, profiles


def test_every_op_that_ran_has_a_compute_entry_and_coverage_is_high(profiled):
    engine, profiles = profiled
    assert len(profiles) == 5
    models = engine.models
    for p in profiles:
        assert p.coverage >= 0.95, (p.coverage, sorted(p.unmapped.items())[:5])
        for op, device in p.placement.items():
            assert models.compute.has(op, device), (op, device)
    used = {d for p in profiles for d in p.placement.values()}
    assert used == set(DEVICES)  # both devices ran ops
    # The convolutions and their gradients take most of the measured compute
    # (about three quarters here); their kernels' times reach their ops.
    means = models.compute.means()
    conv = sum(t for (op, _), t in means.items() if "conv" in op.lower())
    assert conv > 0.5 * sum(means.values()), sorted(means.items(), key=lambda kv: -kv[1])[:5]


def test_requested_placement_is_what_ran(profiled):
    graph, profiles = profiled[0].ir, profiled[1]
    for name in ("conv1/Conv2D", "conv2/Conv2D", "conv3/Conv2D"):
        op = graph[name]
        ran = profiles[-1].placement.get(name)
        if ran is not None:  # fused kernels keep only the last op's name
            assert ran.endswith(op.device[-5:]), (name, ran, op.device)


def test_cost_models_cover_both_devices_and_serialize(profiled, tmp_path):
    models = profiled[0].models
    assert models.compute.devices() == set(DEVICES)
    assert models.memory.total_persistent() > 0
    models.save(tmp_path / "c.json")
    from fastt.costs import CostModels
    assert CostModels.load(tmp_path / "c.json").compute.means() == pytest.approx(
        models.compute.means())


def test_a_plan_over_two_devices_is_calibrated_on_its_own_replay():
    import statistics
    import time

    from fastt.sched.strategy import replay
    model = zoo.build("small_cnn")
    engine = Engine(model.graph, [Device(d) for d in DEVICES], [model.train_op.name])
    config = tf1.ConfigProto(device_count={"CPU": 2})
    with tf1.Session(graph=model.graph, config=config) as sess:
        sess.run(model.init)
        engine.trace(sess, model.feed_dict(), steps=2, warmup=1, untraced_s=1e-3)
    assert list(engine.models.overhead["multi"]) == []  # the original ran on one device
    s = engine.plan("data-parallel")
    gd, graph = engine.rewrite(s, "none")
    g = tf.Graph()
    with g.as_default():
        tf1.import_graph_def(gd, name="")
    feed = {g.get_tensor_by_name(t.name): v for t, v in model.feed_dict().items()}
    with tf1.Session(graph=g, config=config) as sess:
        sess.run(g.get_operation_by_name(model.init.name))
        train = g.get_operation_by_name(model.train_op.name)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            sess.run(train, feed)
            times.append(time.perf_counter() - t)
        untraced = statistics.median(times[1:])
        ps = engine.trace(sess, feed, steps=2, graph=graph, untraced_s=untraced, strategy=s,
                          fifo=True)
    assert all(len({c.device for c in p.compute}) == 2 for p in ps)
    covered = replay(s, engine.devices, engine.costs(), engine.step, fifo=True)[1].makespan
    # each traced step is a record of its spread; the plan's own calibration has one record
    # per untraced sample, replayed over the models its last traced step updated
    assert len(engine.models.overhead["multi"]) == 2
    assert engine.models.overhead["multi"][-1] == pytest.approx(untraced - covered)
    assert engine.predict(s, fifo=True) == pytest.approx(untraced)
    assert list(engine.models.plan_overhead) == [s.key()]
    assert list(engine.models.plan_overhead[s.key()]) == [pytest.approx(untraced - covered)]
    # a plan on one device keeps the overhead of steps on one device; a plan over both that
    # did not run pays what the plans over both that ran pay (here, the profiled one's)
    one_s = statistics.median(engine.models.overhead["one"])
    assert one_s != pytest.approx(untraced - covered)
    one = engine.plan("single", engine.devices[:1])
    spread = engine.plan("m-topo")
    assert spread.key() != s.key() and len(set(spread.placement.values())) == 2
    for plan, extra in ((one, one_s), (spread, untraced - covered)):
        assert engine.predict(plan) == pytest.approx(
            replay(plan, engine.devices, engine.costs(), engine.step)[1].makespan + extra)
    # a graph's untraced steps measured again calibrate its plan too: the original's (on the
    # first device), the data-parallel plan's, beside its profile's
    assert engine.original_plan().key() == one.key()
    engine.calibrate(None, 0.5, fifo=True)
    engine.calibrate(s, 0.25, fifo=True)
    assert engine.predict(one, fifo=True) == pytest.approx(0.5)
    assert list(engine.models.plan_overhead[s.key()]) == [pytest.approx(untraced - covered),
                                                          pytest.approx(0.25 - covered)]
    assert engine.models.spread_plans == {s.key()}  # the original runs on one device
    assert engine.predict(s, fifo=True) == pytest.approx((untraced + 0.25) / 2)
    assert engine.predict(spread) == pytest.approx(  # not measured: the vote of s
        replay(spread, engine.devices, engine.costs(), engine.step)[1].makespan
        + ((untraced - covered) + (0.25 - covered)) / 2)


def test_a_plan_kept_by_control_dependencies_is_replayed_as_it_runs(profiled):
    """Control dependencies keep only the edges the rewrite can add: a prediction replays
    the rewritten graph's own edges, first come, first served; the priority executor keeps
    the whole order."""
    from fastt.sched.strategy import predict
    engine = profiled[0]
    s = engine.plan("m-topo")
    assert engine.runs_as(s) == (s, False)  # in-process: the priority executor
    assert engine.runs_as(s, fifo=True) == (s, True)
    engine.enforce = "control-dependencies"
    try:
        as_run, fifo = engine.runs_as(s)
        assert fifo and (as_run.placement, as_run.order) == (s.placement, s.order)
        gd, _ = engine.rewrite(s, "control-dependencies")
        written = {n.name: {i[1:] for i in n.input if i.startswith("^")} for n in gd.node}
        added = 0
        for op in as_run.graph:
            assert set(op.control_inputs) == written[op.name], op.name
            added += len(op.control_inputs) - len(s.graph[op.name].control_inputs)
        assert added > 0
        assert engine.predict(s) == pytest.approx(
            predict(as_run, engine.devices, engine.costs(), engine.step, fifo=True))
        # a plan's times are those of the order it will run in, chosen as the planner
        # chooses: TensorFlow's where its replay with one transfer at a time is faster
        planned = engine.plan("m-topo")
        pair = {f: (engine.predict(planned, fifo=f),
                    engine.predict(planned, fifo=f, link_concurrency=1)) for f in (False, True)}
        assert planned.ordered == (not pair[True][::-1] < pair[False][::-1])
        assert (planned.predicted_step_time_s, planned.simulated_step_time_s) == \
            pytest.approx(pair[not planned.ordered])
        engine.enforce = "none"  # FASTT_ORDER=0: every plan runs in TensorFlow's order
        unordered = engine.plan("m-topo")
        assert not unordered.ordered and unordered.predicted_step_time_s == pytest.approx(
            engine.predict(unordered, fifo=True))
    finally:
        engine.enforce = "priority-executor"
    with pytest.raises(FasttError, match="unknown order mechanism 'fifo'"):
        Engine(engine.graph, engine.devices, engine.fetches, enforce="fifo")
