import json

import numpy as np
import pytest

from fastt.costs import CommCostModel, ComputeCostModel, CostModels, MemoryModel
from fastt.costs.comm import PROBED
from fastt.costs.source import ModelCosts, StaticCosts
from fastt.errors import CostModelError
from fastt.ir import Graph, TensorRef
from fastt.profiler import ComputeSample, TransferSample
from tests.helpers import op

G0 = "/job:localhost/replica:0/task:0/device:GPU:0"
G1 = "/job:localhost/replica:0/task:0/device:GPU:1"
C0 = "/job:localhost/replica:0/task:0/device:CPU:0"


def test_compute_mean_window_and_missing_rules():
    m = ComputeCostModel(window=2)
    m.update([ComputeSample("conv", G0, 1.0)])
    m.update([ComputeSample("conv", G0, 2.0)])
    m.update([ComputeSample("conv", "/gpu:0", 4.0)])  # short name, same key
    assert m.cost("conv", G0) == pytest.approx(3.0)  # mean of the last two
    assert m.cost("conv", G1) == pytest.approx(3.0)  # same-type fallback
    assert m.cost("conv", C0) == 0.0  # no CPU entry: 0, FastT's explore rule
    assert m.cost("unseen", G0) == 0.0
    strict = ComputeCostModel(fallback_same_type=False)
    strict.update([ComputeSample("conv", G0, 1.0)])
    assert strict.cost("conv", G1) == 0.0


def test_stability_is_time_weighted():
    m = ComputeCostModel(window=1)
    assert not m.is_stable()
    m.update([ComputeSample("big", G0, 1.0), ComputeSample("tiny", G0, 1e-6)])
    assert m.relative_change() == float("inf")
    m.update([ComputeSample("big", G0, 1.01), ComputeSample("tiny", G0, 3e-6)])  # tiny triples
    assert m.is_stable(0.05)
    m.update([ComputeSample("big", G0, 2.0), ComputeSample("tiny", G0, 3e-6)])
    assert not m.is_stable(0.05)


def test_comm_regression_recovers_the_link_under_waits_that_only_add_time():
    # Traced transfers: a quarter ran on an idle link (1% bandwidth wobble, 2 us timer jitter),
    # the rest also waited for busy cores or other transfers (exponential, mean 3 ms: 120 times
    # the link's latency). The link's own line is what the simulator needs.
    rng = np.random.default_rng(7)
    slope, intercept = 1 / 12e9, 25e-6  # 12 GB/s, 25 us
    m = CommCostModel()
    sizes = np.exp(rng.uniform(np.log(1e3), np.log(16e6), 400))
    times = intercept + slope * sizes
    times = times * (1 + rng.normal(0, 0.01, times.shape)) + rng.normal(0, 2e-6, times.shape)
    waited = rng.random(times.shape) > 0.25
    times = times + waited * rng.exponential(3e-3, times.shape)
    m.update(TransferSample(G0, G1, n, t) for n, t in zip(sizes, times))
    fit = m.fit(G0, G1)
    assert fit.slope == pytest.approx(slope, rel=0.05)
    assert fit.intercept == pytest.approx(intercept, abs=10e-6)  # least squares: ~2.3 ms
    assert m.cost(1e6, G0, G1) == pytest.approx(intercept + slope * 1e6, rel=0.1)
    assert m.cost(1e6, G0, G0) == 0.0


def test_comm_fit_of_clean_samples_is_the_line():
    m = CommCostModel()
    sizes = [4 ** k * 1024 for k in range(8)]
    m.update(TransferSample(G0, G1, n, 25e-6 + n / 12e9) for n in sizes)
    fit = m.fit(G0, G1)
    assert fit.slope == pytest.approx(1 / 12e9, rel=1e-6)
    assert fit.intercept == pytest.approx(25e-6, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)


def test_comm_fit_of_the_probes_points_alone_is_their_median_line():
    # The probe's 8 sizes, each already the lower quartile of its repeats; one reads 40% low
    # (a repeat that caught an idle moment). A decile of 8 points is their lower envelope,
    # which that point tilts; the median line keeps the one the other seven lie on.
    sizes = [4 ** k * 1024 for k in range(8)]
    times = [100e-6 + n / 2e9 for n in sizes]
    times[6] *= 0.6  # 4 MiB
    m = CommCostModel()
    m.update(TransferSample(G0, G1, n, t, PROBED) for n, t in zip(sizes, times))
    fit = m.fit(G0, G1)
    assert fit.r2 >= 0.98 and fit.slope == pytest.approx(1 / 2e9, rel=0.05)
    assert fit.intercept == pytest.approx(100e-6, rel=0.1)  # the small sizes set the latency
    envelope = CommCostModel()  # the same points as traced transfers: the decile fit
    envelope.update(TransferSample(G0, G1, n, t) for n, t in zip(sizes, times))
    assert envelope.fit(G0, G1).r2 < fit.r2
    # once traced transfers join, the pair is fitted on the lower decile of all its samples
    m.update([TransferSample(G0, G1, n, (50e-6 + n / 4e9) * k) for n in sizes for k in (1, 3)])
    both = m.fit(G0, G1)
    assert both.samples == 24 and both.slope == pytest.approx(1 / 4e9, rel=0.05)
    again = CostModels.from_dict(CostModels(comm=m).to_dict()).comm.fit(G0, G1)
    assert (again.slope, again.intercept) == pytest.approx((both.slope, both.intercept))
    # where the transfers take the ends' cores, the traced ones also waited for them (the
    # simulator charges that through the shares): the probe alone fits the link
    m.set_cpu_share(G1, G0, 0.5, 1.0)  # measured one way: it holds for both
    alone = m.fit(G0, G1)
    assert alone.samples == 8 and alone.slope == pytest.approx(fit.slope)
    assert alone.intercept == pytest.approx(fit.intercept)
    again = CostModels.from_dict(CostModels(comm=m).to_dict()).comm.fit(G0, G1)
    assert (again.slope, again.samples) == pytest.approx((alone.slope, 8))
    unprobed = CommCostModel()  # traced transfers only: they fit it, shares or not
    unprobed.update([TransferSample(G0, G1, n, 50e-6 + n / 4e9) for n in sizes])
    unprobed.set_cpu_share(G0, G1, 0.5, 1.0)
    assert unprobed.fit(G0, G1).slope == pytest.approx(1 / 4e9, rel=0.05)


def test_comm_fit_of_probed_points_that_bend_is_a_hinge_and_of_a_line_none():
    # Between two single-core gRPC workers the cost per byte grew past 16 MiB (14.7 ms at
    # 16 MiB, 118.9 at 64): the probe's sizes to 64 MiB, each byte past 16 MiB 1 ns dearer
    MiB = 2 ** 20
    sizes = [4 ** k * 1024 for k in range(8)] + [32 * MiB, 64 * MiB]
    bent = [100e-6 + n / 2e9 + max(n - 16 * MiB, 0) / 1e9 for n in sizes]
    m = CommCostModel()
    m.update(TransferSample(G0, G1, n, t, PROBED) for n, t in zip(sizes, bent))
    fit = m.fit(G0, G1)
    assert fit.knee == 16 * MiB and fit.extra == pytest.approx(1e-9, rel=0.02)
    assert fit.slope == pytest.approx(1 / 2e9, rel=0.02)
    assert fit.predict(64 * MiB) == pytest.approx(bent[-1], rel=0.01)
    assert fit.predict(4 * MiB) == pytest.approx(bent[6], rel=0.01)
    costs = ModelCosts(CostModels(comm=m))
    assert costs.link_knee(G0, G1) == (16 * MiB, pytest.approx(1e-9, rel=0.02))
    again = CostModels.from_dict(json.loads(json.dumps(CostModels(comm=m).to_dict())))
    assert again.comm.fit(G0, G1).knee == 16 * MiB
    # a line with one point 30% off (a repeat that caught load) keeps the line
    straight = [100e-6 + n / 2e9 for n in sizes]
    straight[-2] *= 1.3
    line = CommCostModel()
    line.update(TransferSample(G0, G1, n, t, PROBED) for n, t in zip(sizes, straight))
    assert line.fit(G0, G1).extra == 0 and line.fit(G0, G1).knee == float("inf")
    assert ModelCosts(CostModels(comm=line)).link_knee(G0, G1) == (float("inf"), 0.0)
    # per byte cheaper for large sizes (concave): a line too
    concave = CommCostModel()
    concave.update(TransferSample(G0, G1, n, 100e-6 + n / 2e9 - max(n - 16 * MiB, 0) / 8e9,
                                  PROBED) for n in sizes)
    assert concave.fit(G0, G1).extra == 0
    # traced transfers are fitted by a line, whatever their shape
    traced = CommCostModel()
    traced.update(TransferSample(G0, G1, n, t) for n, t in zip(sizes, bent))
    assert traced.fit(G0, G1).extra == 0


def test_comm_refits_on_new_samples_and_falls_back():
    m = CommCostModel()
    m.update([TransferSample(G0, G1, 1e6, 1e-3), TransferSample(G0, G1, 2e6, 2e-3)])
    first = m.fit(G0, G1).slope
    m.update([TransferSample(G0, G1, 3e6, 9e-3)])
    assert m.fit(G0, G1).slope > first  # refitted
    assert m.fit(G1, G0) is None
    assert m.cost(1e6, G1, G0) == pytest.approx(m.cost(1e6, G0, G1))  # reverse pair
    assert CommCostModel().cost(1e6, G0, G1) == 0.0  # nothing known: 0
    assert m.cost(1.0, G0, G1) >= 0.0


def test_an_unprobed_pair_of_one_process_takes_its_kinds_links_not_all():
    """Devices of one process: one probed pair stands for the pairs of its kind; a pair
    between processes falls back to the mean of all links."""
    w0, w1 = (f"/job:worker/replica:0/task:{t}/device:CPU:0" for t in (0, 1))
    m = CommCostModel()
    for src, dst, slope in ((G0, G1, 1e-9), (w0, w1, 1e-7)):
        m.update([TransferSample(src, dst, n, 1e-5 + slope * n) for n in (1e5, 1e6, 1e7)])
    g2, g3 = G0.replace("GPU:0", "GPU:2"), G0.replace("GPU:0", "GPU:3")
    assert m.link(g2, g3).slope == pytest.approx(1e-9, rel=0.05)  # its kind's, GPU-GPU
    w2 = w0.replace("task:0", "task:2")
    assert m.link(w1, w2).slope == pytest.approx((1e-9 + 1e-7) / 2, rel=0.05)


def test_memory_model_from_graph_and_refine():
    g = Graph([op("w", "VariableV2", out=((10, 10),), dtype="float32_ref", is_variable=True,
                  attrs={"shape": [10, 10], "dtype": "float32"}),
               op("x", "Placeholder", out=((None, 10),)),
               op("y", "MatMul", ["x", "w"], out=((None, 10),))])
    mem = MemoryModel.from_graph(g)
    assert mem.persistent == {"w": 400}
    assert mem.outputs["y"] == 0  # unknown batch
    mem.refine({TensorRef("y", 0): 320})
    assert mem.op_bytes("y") == 320 and mem.op_bytes("w") == 800


def test_cost_models_json_round_trip(tmp_path):
    models = CostModels(memory=MemoryModel({"w": 4}, {"y": 8}, {G0: 2**30}))
    models.compute.update([ComputeSample("y", G0, 0.5)])
    models.comm.update([TransferSample(G0, G1, 10, 1.0), TransferSample(G0, G1, 20, 2.0)])
    path = tmp_path / "costs.json"
    models.save(path)
    loaded = CostModels.load(path)
    assert loaded.compute.cost("y", G0) == 0.5
    assert loaded.comm.fit(G0, G1).slope == pytest.approx(0.1)
    assert loaded.memory.capacity == {G0: 2**30}
    assert json.loads(path.read_text())["schema_version"] == 1


def test_cost_model_bad_files_are_named(tmp_path):
    with pytest.raises(CostModelError, match="does not exist"):
        CostModels.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(CostModelError, match="not JSON"):
        CostModels.load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"a": 1}')
    with pytest.raises(CostModelError, match="schema_version"):
        CostModels.load(tmp_path / "other.json")


def test_cpu_shares_and_step_overhead_are_kept_and_saved():
    from fastt.profiler import Profile
    m = CostModels()
    assert m.comm.cpu_share(G0, G1) == (0.0, 0.0) and m.step_overhead() == 0.0
    m.comm.set_cpu_share(G0, G1, 0.9, 1.0, 30e-6, 20e-6)
    assert m.comm.cpu_share(G1, G0) == (0.9, 1.0)  # the roles set the shares
    assert m.comm.burst_cpu(G1, G0) == (30e-6, 20e-6)
    with pytest.raises(ValueError, match="between 0 and 1"):
        m.comm.set_cpu_share(G0, G1, 1.5, 0.0)
    with pytest.raises(ValueError, match="0 or more"):
        m.comm.set_cpu_share(G0, G1, 0.5, 0.5, -1e-6, 0.0)
    for wall in (3e-3, 5e-3, 4e-3):  # untraced step times
        m.update(Profile(span_s=2e-3, untraced_s=wall))
    m.update(Profile(span_s=2e-3))  # without the untraced step time, no overhead
    assert m.step_overhead() == pytest.approx(2e-3)
    back = CostModels.from_dict(m.to_dict())
    assert back.comm.cpu_share(G0, G1) == (0.9, 1.0)
    assert back.comm.burst_cpu(G0, G1) == (30e-6, 20e-6)
    assert back.step_overhead() == pytest.approx(2e-3)


def test_a_traced_transfer_takes_from_the_kernels_beside_it_what_the_simulator_charges():
    m = CostModels()
    for nbytes in (1e3, 1e5, 1e6, 1e7):  # a link of 0.1 ms and 1 GB/s
        m.comm.add_sample(G0, G1, nbytes, 1e-4 + nbytes * 1e-9, probed=True)
    m.comm.set_cpu_share(G0, G1, 0.5, 1.0, 20e-6, 40e-6)
    # 8 MB moved in 8 ms of bandwidth time: traced over those 8 ms (plus latency), the ends
    # give it their whole share
    send, recv = m.comm.background(G0, G1, 8e6, 8.1e-3)
    assert (send, recv) == (pytest.approx((0.5 * 8e-3 + 20e-6) / 8.1e-3),
                            pytest.approx((8e-3 + 40e-6) / 8.1e-3))
    # traced over 32 ms (it waited for busy cores): the same work over four times the time
    slow = m.comm.background(G0, G1, 8e6, 32e-3)
    assert slow == (pytest.approx((0.5 * 8e-3 + 20e-6) / 32e-3),
                    pytest.approx((8e-3 + 40e-6) / 32e-3))
    assert m.comm.background(G0, G1, 8e6, 1e-3) == (0.5, 1.0)  # never above the share
    unfit = CostModels()
    unfit.comm.set_cpu_share(G0, G1, 0.5, 1.0)
    assert unfit.comm.background(G0, G1, 8e6, 32e-3) == (0.5, 1.0)  # no link known: its share


def test_what_reaching_a_device_costs_is_kept_apart_from_the_step_overhead():
    from fastt.profiler import Profile
    m = CostModels(device_step={G1: 1e-3})
    assert m.reach(G0) == 0.0 and m.reach(G1.replace("/device:GPU:1", "/gpu:1")) == 1e-3
    remote = [ComputeSample("a", G0, 1e-3), ComputeSample("b", G1, 1e-3)]
    m.update(Profile(compute=remote, span_s=2e-3, untraced_s=3.5e-3))  # 1 ms is G1's call
    m.update(Profile(compute=remote[:1], span_s=2e-3, untraced_s=2.5e-3))
    m.update(Profile(compute=remote[1:], span_s=2e-3, untraced_s=2e-3))  # never below 0
    assert list(m.overhead["multi"]) == pytest.approx([0.5e-3])
    assert list(m.overhead["one"]) == pytest.approx([0.5e-3, 0.0])
    assert CostModels.from_dict(json.loads(json.dumps(m.to_dict()))).reach(G1) == 1e-3


def test_how_late_a_busy_device_serves_a_request_reaches_the_simulator():
    from fastt.sched.sim.problem import Device, Problem
    m = CostModels(serve={G0: 3e-3})
    again = CostModels.from_dict(json.loads(json.dumps(m.to_dict())))
    assert again.serve_delay(G0.replace("/device:GPU:0", "/gpu:0")) == 3e-3
    assert again.serve_delay(G1) == 0.0  # not probed
    g = Graph([op("a", "Const"), op("b", "Relu", ["a"])])
    p = Problem.from_graph(g, [Device(G0), Device(G1)], ModelCosts(again))
    assert p.serve_delay == [3e-3, 0.0]


def test_a_plan_measured_before_pays_its_own_overhead_others_their_spreads():
    m = CostModels()
    assert m.step_overhead(1) == m.step_overhead(2) == m.step_overhead() == 0.0
    for s in (5e-3, -1e-3, 4e-3):  # a replay may run longer than the step
        m.record_overhead(s, 2, "dp")
    # nothing on one device known yet: every plan pays what the one profiled did
    assert m.step_overhead(1) == m.step_overhead(2, "other") == pytest.approx(4e-3)
    for s in (1e-3, 2e-3, 3e-3):
        m.record_overhead(s, 1, "single")  # one device: no plan of its own
    assert m.step_overhead(2, "dp") == m.step_overhead(3, "dp") == pytest.approx(4e-3)
    # a plan over several devices that never ran: the plans over several devices' vote
    assert m.step_overhead(2, "other") == m.step_overhead(3) == pytest.approx(4e-3)
    assert m.step_overhead(1) == m.step_overhead(1, "single") == pytest.approx(2e-3)
    assert m.step_overhead() == pytest.approx(2e-3)  # the least: a bound
    assert list(m.plan_overhead) == ["dp"] and m.spread_plans == {"dp"}
    again = CostModels.from_dict(json.loads(json.dumps(m.to_dict())))
    assert {k: list(q) for k, q in again.plan_overhead.items()} == {"dp": [5e-3, -1e-3, 4e-3]}
    assert again.spread_plans == {"dp"}
    assert again.step_overhead(2, "dp") == pytest.approx(4e-3)
    assert {k: list(q) for k, q in again.overhead.items()} == \
        {k: list(q) for k, q in m.overhead.items()}
    # a plan measured again adds a record of its own, on any number of devices
    again.calibrate("dp", 7e-3)
    again.calibrate("single", 6e-3, devices_used=1)
    assert again.step_overhead(2, "dp") == pytest.approx(4.5e-3)  # of 5, -1, 4, 7
    assert again.step_overhead(1, "single") == pytest.approx(6e-3)
    assert again.step_overhead(1) == pytest.approx(2e-3)
    assert again.step_overhead(2, "other") == pytest.approx(4.5e-3)  # one device's: no vote
    # one vote per plan: a plan with many far records does not set the others
    for s in (0.19, 0.2, 0.18, 0.19):
        again.calibrate("mp", s, devices_used=2)
    again.calibrate("ps", 6e-3, devices_used=2)
    assert again.spread_plans == {"dp", "mp", "ps"}
    assert again.step_overhead(2, "other") == pytest.approx(6e-3)  # of 4.5, 190, 6 ms
    # the same sample again (a profile's next traced step, replayed over updated models)
    # takes the place of its record: one sample, one record
    again.calibrate("dp", 9e-3, again=True)
    assert list(again.plan_overhead["dp"]) == [5e-3, -1e-3, 4e-3, 9e-3]
    again.record_overhead(1e-3, 2, "dp", again=True)
    assert list(again.plan_overhead["dp"]) == [5e-3, -1e-3, 4e-3, 1e-3]
    assert again.overhead["multi"][-1] == 1e-3  # a spread keeps every traced step's
    # a document from before the split: its steps counted as on one device
    old = {k: v for k, v in m.to_dict().items() if k != "spread_plans"}
    old["step_overhead_s"] = [1e-3, 3e-3]
    assert CostModels.from_dict(old).step_overhead(2) == pytest.approx(2e-3)
    with pytest.raises(CostModelError, match="step_overhead_s"):
        CostModels.from_dict({**m.to_dict(), "step_overhead_s": 3})


def test_a_static_table_given_as_a_function_is_read_once_when_first_needed():
    from fastt.sched.sim.device_spec import parse
    calls = []

    def table():
        calls.append(1)
        return {"a": 2.0}
    costs = StaticCosts(table, parse("2xV100"))
    assert calls == []
    assert costs.compute("a", "x") == 2.0 and costs.compute_row("b", ["x", "y"]) == [0.0, 0.0]
    assert calls == [1]
