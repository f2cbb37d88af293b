"""The grounding benchmark's calibration (no TensorFlow): factors per op class fitted by
non-negative least squares, each model scored with factors fitted without it."""
import pytest

from benchmarks import grounding


class Op:
    def __init__(self, name, type_):
        self.name, self.type = name, type_


GRAPH = [Op("conv", "Conv2D"), Op("grad", "Conv2DBackpropFilter"), Op("mm", "MatMul"),
         Op("relu", "Relu"), Op("bn", "FusedBatchNormV3")]


def test_op_classes():
    assert [grounding.op_class(o.type) for o in GRAPH] == [
        "compute", "compute", "compute", "memory", "memory"]


def rows_from(factors, shares):
    """Rows whose measured steps are exactly their class sums times ``factors``."""
    rows = []
    for k, (c, m) in enumerate(shares):
        rows.append({"model": f"m{k}", "zoo": f"m{k}", "class_s": {"compute": c, "memory": m},
                     "measured_step_s": factors["compute"] * c + factors["memory"] * m})
    return rows


def test_fit_recovers_the_factors_that_made_the_figures():
    truth = {"compute": 1.6, "memory": 0.7}
    f = grounding.fit(rows_from(truth, [(1.0, 0.2), (0.5, 0.5), (2.0, 1.5), (0.3, 0.9)]))
    assert f == pytest.approx(truth, rel=1e-9)


def test_each_model_is_scored_with_factors_fitted_without_it(monkeypatch):
    truth = {"compute": 1.6, "memory": 0.7}
    rows = rows_from(truth, [(1.0, 0.2), (0.5, 0.5), (2.0, 1.5), (0.3, 0.9)])
    rows[2]["measured_step_s"] *= 3  # a model no factor explains
    def fake_simulate(graph, fetch, seconds, gpus):
        return sum(seconds.values())

    monkeypatch.setattr(grounding, "simulate", fake_simulate)
    for r in rows:
        c, m = r["class_s"]["compute"], r["class_s"]["memory"]
        g = [Op("conv", "Conv2D"), Op("relu", "Relu")]
        r.update(batch_per_gpu=8, published_1=8 / r["measured_step_s"], published_8=50.0,
                 step_1_s=c + m, step_8_s=c + m, source="src", allreduces=10,
                 _graphs=(g, [], {"conv": c, "relu": m}, g, [], {"conv": c, "relu": m}))
    grounding.calibrate(rows)
    for i, r in enumerate(rows):
        assert r["factors"] == pytest.approx(grounding.fit(rows[:i] + rows[i + 1:]))
    # two rows of one zoo model (two sources): each scored without the other
    rows[1]["zoo"] = rows[0]["zoo"]
    grounding.calibrate(rows)
    assert rows[0]["factors"] == pytest.approx(grounding.fit(rows[2:]))
    # the outlier, scored with factors fitted on the others alone: the true ones, and its
    # step three times what they predict
    assert rows[2]["factors"] == pytest.approx(truth)
    assert rows[2]["calibrated_error_1"] == pytest.approx(2.0)
    assert all(r["factors"] != pytest.approx(truth) for r in rows if r is not rows[2])


def test_each_gpu_fed_its_own_share_cuts_and_sends_nothing():
    from fastt.sched.sim.device_spec import parse
    from fastt.sched.strategy import plan, replay
    from tests.helpers import costs, momentum_graph
    g = momentum_graph(B=64, F=256)
    ds = parse("2xV100:pcie")
    c = costs(ds, g)
    s = plan(g, ds.devices, c, "data-parallel", ds.copy_bytes_per_s, fetches=["train"])
    seen = {}

    def cut(p):
        seen["cuts"] = [i for i, n in enumerate(p.names) if s.graph[n].type == "SplitV"
                        and any(r.op == "x" for r in s.graph[n].inputs)]
        seen["sent"] = any(p.edge_bytes[e] > 0 for i in seen["cuts"] for _, e in p.succs[i])
        grounding.per_gpu_input(p, s.graph, {"x"})

    before = replay(s, ds.devices, c, g, ds.copy_bytes_per_s, link_concurrency=1)[1]
    p, after = replay(s, ds.devices, c, g, ds.copy_bytes_per_s, link_concurrency=1,
                      adjust=cut)
    assert seen["cuts"] and seen["sent"]
    for i in seen["cuts"]:
        assert p.w[i] == [0.0, 0.0]
        assert all(p.edge_bytes[e] == 0 and all(b == 0 for _, b in p.edge_tensors[e])
                   for _, e in p.succs[i])
    assert after.makespan < before.makespan


def launch_rows(launch_s, shapes):
    """Rows whose published scaling efficiency is what their simulated steps give with each
    of their ``n`` all-reduces holding the GPUs ``launch_s``: shapes (step1, step8, n)."""
    rows = []
    for k, (s1, s8, n) in enumerate(shapes):
        eff = s1 / (s8 + launch_s * n)
        rows.append({"model": f"m{k}", "zoo": f"m{k}", "source": "src", "allreduces": n,
                     "calibrated_1_s": s1, "calibrated_8_s": s8, "published_1": 100.0,
                     "published_8": 800.0 * eff, "efficiency_published": eff})
    return rows


def test_launch_fit_recovers_the_launch_that_made_the_efficiencies():
    rows = launch_rows(3e-4, [(0.5, 0.51, 400), (0.4, 0.41, 100), (0.8, 0.82, 30)])
    assert grounding.fit_launch(rows) == pytest.approx(3e-4, rel=1e-3)
    # rows whose source accumulates gradients are not fitted on
    rows[0]["source"] = next(iter(grounding.ACCUMULATES))
    rows[0]["efficiency_published"] = 0.99
    assert grounding.fit_launch(rows) == pytest.approx(3e-4, rel=1e-3)
    assert grounding.fit_launch(rows[:1]) == 0.0


def test_each_model_is_scored_with_a_launch_fitted_without_it(monkeypatch):
    rows = launch_rows(3e-4, [(0.5, 0.51, 400), (0.4, 0.408, 100), (0.8, 0.816, 30),
                              (0.6, 0.612, 200)])
    rows[3]["published_8"] = 400.0  # efficiency 0.5: a model no launch explains
    monkeypatch.setattr(grounding, "simulate", lambda graph, fetch, seconds, gpus:
                        sum(seconds.values()) * (1.02 if gpus > 1 else 1.0))
    g = [Op("conv", "Conv2D")]
    for r in rows:
        r.update(class_s={"compute": r["calibrated_1_s"], "memory": 0.0}, batch_per_gpu=8,
                 measured_step_s=r["calibrated_1_s"], step_1_s=1.0, step_8_s=1.0,
                 _graphs=(g, [], {"conv": r["calibrated_1_s"]}, g, [],
                          {"conv": r["calibrated_1_s"]}))
    grounding.calibrate(rows)
    for i, r in enumerate(rows):
        assert r["launch_s"] == pytest.approx(grounding.fit_launch(rows[:i] + rows[i + 1:]))
        assert r["calibrated_8"] == pytest.approx(
            8 * 8 / (r["calibrated_8_s"] + r["launch_s"] * r["allreduces"]))
    # the outlier is scored with the launch the others share, and left far from its figure
    assert rows[3]["launch_s"] == pytest.approx(3e-4, rel=1e-2)
    assert rows[3]["efficiency_calibrated"] - 0.5 > 0.3
    assert all(r["launch_s"] != pytest.approx(3e-4, rel=1e-3) for r in rows[:3])
