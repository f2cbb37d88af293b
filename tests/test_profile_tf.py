"""Profiling real training steps over 2 logical CPU devices."""
import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1
tf1.disable_eager_execution()

from fastt import zoo  # noqa: E402
from fastt.adapters.engine import Engine  # noqa: E402
from fastt.sched.problem import Device  # noqa: E402

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
    # The convolutions (and their gradients) dominate measured compute time.
    top = max(models.compute.means().items(), key=lambda kv: kv[1])[0][0]
    assert "Conv2D" in top or "conv" in top


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
