import logging
import random

import pytest

from fastt.costs.source import CostSource
from fastt.ir import Graph
from fastt.sched import Device, dpos
from fastt.sched.search.osdpos import compiler, os_dpos, schedule_critical_path
from fastt.sched.sim.problem import Problem
from fastt.passes.splitting import apply_splits
from tests.exact import check_schedule
from tests.helpers import op


class TableCosts(CostSource):
    """Per-op times equal on every device; links: intercept + slope * bytes."""

    def __init__(self, times, intercept=1e-5, slope=1e-10):
        self.times, self.intercept, self.slope = times, intercept, slope

    def compute(self, name, device):
        return self.times.get(name, 0.0)

    def link(self, src, dst):
        return (self.intercept, self.slope)


def devs(k):
    return [Device(f"/job:localhost/replica:0/task:0/device:GPU:{d}") for d in range(k)]


def big_conv():
    return Graph([
        op("x", "Placeholder", out=((64, 32, 32, 16),)),
        op("w", "Const", out=((3, 3, 16, 64),)),
        op("conv", "Conv2D", ["x", "w"], out=((64, 32, 32, 64),)),
        op("relu", "Relu", ["conv"], out=((64, 32, 32, 64),)),
        op("loss", "Sum", ["relu"], out=((),)),
    ])


def test_splitting_a_dominant_conv_beats_dpos():
    g = big_conv()
    costs = TableCosts({"x": 1e-6, "w": 1e-6, "conv": 8e-3, "relu": 1e-3, "loss": 1e-4})
    compile_graph = compiler(devs(4), costs, g)
    base = dpos(compile_graph(g))
    plan = os_dpos(g, compile_graph, 4)
    assert base.makespan >= 9.1e-3  # one device does it all
    assert plan.splits and plan.splits[0].op == "conv"
    # 8 ms of conv over 4 devices, plus cutting and re-joining 16 MB at 10 GB/s (~2 ms).
    assert plan.makespan < 0.7 * base.makespan
    check_schedule(plan.problem, plan.schedule)
    # The Relu was split the same way and reads the conv's parts directly.
    if any(s.op == "relu" for s in plan.splits):
        assert plan.graph["relu/part0"].inputs[0].op == "conv/part0"


def test_the_split_search_stops_at_its_budget(caplog):
    g = big_conv()
    costs = TableCosts({"x": 1e-6, "w": 1e-6, "conv": 8e-3, "relu": 1e-3, "loss": 1e-4})
    compile_graph = compiler(devs(4), costs, g)
    with caplog.at_level(logging.INFO, logger="fastt"):
        spent = os_dpos(g, compile_graph, 4, budget_s=0.0)
    assert not spent.splits and spent.tried == 0  # (unbounded, it splits the conv: above)
    assert spent.makespan == dpos(compile_graph(g)).makespan
    assert "stopped at its 0 s budget" in caplog.text


def test_no_candidate_split_is_begun_past_the_budget(monkeypatch):
    """Each reading of the (fake) clock is a second later: the search begins at 0, looks at
    the conv at 1, begins its first candidate at 2 and none after, its budget ending at 2.5
    (before, every candidate of the op it was on was evaluated)."""
    from fastt.sched.search import osdpos
    g = big_conv()
    costs = TableCosts({"x": 1e-6, "w": 1e-6, "conv": 8e-3, "relu": 1e-3, "loss": 1e-4})
    compile_graph = compiler(devs(4), costs, g)
    ticks = iter(range(1000))
    monkeypatch.setattr(osdpos, "clock", lambda: float(next(ticks)))
    plan = os_dpos(g, compile_graph, 4, budget_s=2.5)
    assert plan.tried == 1
    ticks = iter(range(1000))
    assert os_dpos(g, compile_graph, 4, budget_s=1e9).tried > 3  # the conv's candidates


def test_no_candidate_is_begun_that_would_end_past_the_budget(monkeypatch):
    """A candidate begins only where the longest one so far would still end within the
    budget (one on a large data-parallel graph takes seconds); the seconds each took are
    what the next ones are judged by."""
    from fastt.sched.search import osdpos
    g = big_conv()
    costs = TableCosts({"x": 1e-6, "w": 1e-6, "conv": 8e-3, "relu": 1e-3, "loss": 1e-4})
    compile_graph = compiler(devs(4), costs, g)
    start = osdpos.Plan(g, compile_graph(g), osdpos.dpos(compile_graph(g)))
    now = [7.0]
    monkeypatch.setattr(osdpos, "clock", lambda: now[0])
    candidate = ("batch", 2, ("conv",))
    # 7 s now, 10 s the deadline: a candidate expected to take 4 s is not begun, one of 2 is
    assert osdpos._best(start, compile_graph, [candidate], 1, 10.0, 4.0) == (None, 4.0)
    assert start.tried == 0
    real = osdpos.dpos

    def dpos_of_3_s(p):
        now[0] += 3.0
        return real(p)
    monkeypatch.setattr(osdpos, "dpos", dpos_of_3_s)
    assert osdpos._best(start, compile_graph, [candidate], 1, 10.0, 2.0) == (candidate, 3.0)
    assert start.tried == 1


def test_before_any_candidate_the_start_graphs_build_time_is_what_one_is_expected_to_take():
    g = big_conv()
    costs = TableCosts({"x": 1e-6, "w": 1e-6, "conv": 8e-3, "relu": 1e-3, "loss": 1e-4})
    compile_graph = compiler(devs(4), costs, g)
    # a candidate said to take 50 s against a 10 s budget: none is begun
    assert os_dpos(g, compile_graph, 4, budget_s=10.0, candidate_s=50.0).tried == 0
    assert os_dpos(g, compile_graph, 4, budget_s=10.0, candidate_s=0.001).tried > 3


def test_a_split_records_why_it_was_made():
    g = big_conv()
    ops = [o if o.name != "w" else op("w", "VariableV2", out=((3, 3, 16, 64),), is_variable=True)
           for o in g]
    g = Graph(ops[:2] + [op("w_read", "Identity", ["w"], out=((3, 3, 16, 64),))] +
              [op("conv", "Conv2D", ["x", "w_read"], out=((64, 32, 32, 64),))] + ops[3:])
    costs = TableCosts({"conv": 8e-3, "relu": 1e-3, "loss": 1e-4})
    plan = os_dpos(g, compiler(devs(4), costs, g), 4)
    first = plan.splits[0]
    assert first.op == "conv" and first.time_before_s == pytest.approx(8e-3)
    assert first.param_bytes == 3 * 3 * 16 * 64 * 4
    assert first.step_after_s < first.step_before_s
    assert first.details()["param_bytes"] == first.param_bytes
    assert first == type(first)("conv", first.dim, first.n)  # details are not identity


def test_no_split_when_transfers_are_too_expensive():
    g = big_conv()
    costs = TableCosts({"conv": 8e-3, "relu": 1e-3}, intercept=1.0)
    compile_graph = compiler(devs(2), costs, g)
    plan = os_dpos(g, compile_graph, 2)
    assert plan.splits == [] and plan.makespan == pytest.approx(dpos(compile_graph(g)).makespan)


def random_graph(rnd):
    """A random DAG of <= 8 matmul / element-wise ops on [B, F] tensors."""
    B = rnd.choice([4, 6, 8])
    ops = [op("x", "Placeholder", out=((B, 8),))]
    names = ["x"]
    for k in range(rnd.randint(1, 7)):
        a = rnd.choice(names)
        kind = rnd.choice(["MatMul", "Relu", "AddV2"])
        if kind == "MatMul":
            ops.append(op(f"w{k}", "Const", out=((8, 8),)))
            ops.append(op(f"o{k}", "MatMul", [a, f"w{k}"], out=((B, 8),)))
        elif kind == "Relu":
            ops.append(op(f"o{k}", "Relu", [a], out=((B, 8),)))
        else:
            ops.append(op(f"o{k}", "AddV2", [a, rnd.choice(names)], out=((B, 8),)))
        names.append(f"o{k}")
    return Graph(ops)


def test_os_dpos_never_worse_than_dpos_on_300_random_graphs():
    rnd = random.Random(42)
    improved = 0
    for _ in range(300):
        g = random_graph(rnd)
        D = rnd.randint(2, 3)
        costs = TableCosts({o.name: rnd.uniform(1e-4, 1e-2) for o in g},
                           intercept=rnd.uniform(0, 1e-3), slope=rnd.uniform(0, 1e-8))
        compile_graph = compiler(devs(D), costs, g)
        base = dpos(compile_graph(g)).makespan
        plan = os_dpos(g, compile_graph, D)
        assert plan.makespan <= base + 1e-12
        check_schedule(plan.problem, plan.schedule)
        improved += plan.makespan < base
    assert improved > 0  # splitting does help on some of them


def test_schedule_critical_path_ends_at_the_makespan():
    p = Problem.build(4, [(0, 1, 0), (0, 2, 0), (1, 3, 0), (2, 3, 0)],
                      [[1, 1], [4, 4], [3, 3], [1, 1]], devs(2), intercept=1.0)
    s = dpos(p)
    assert schedule_critical_path(p, s) == [0, 2, 3]  # d waits for c's transfer (6), not b (5)


def test_parallel_candidate_evaluation_gives_the_same_plan():
    g = big_conv()
    costs = TableCosts({"x": 1e-6, "w": 1e-6, "conv": 8e-3, "relu": 1e-3, "loss": 1e-4})
    compile_graph = compiler(devs(4), costs, g)
    serial = os_dpos(g, compile_graph, 4, workers=1)
    parallel = os_dpos(g, compile_graph, 4, workers=2)
    assert parallel.splits == serial.splits and parallel.tried == serial.tried
    assert parallel.makespan == serial.makespan


def test_the_search_goes_past_a_split_that_does_not_pay():
    # The dearest critical-path op (a Mul over 64 MiB) costs more to cut and re-join than
    # splitting saves; the next one (a MatMul over small tensors) halves when split. FastT's
    # search stopped at the first; this one goes on (up to MISSES ops in a row).
    g = Graph([
        op("x", "Placeholder", out=((64, 128),)),
        op("w", "Const", out=((128, 128),)),
        op("mm", "MatMul", ["x", "w"], out=((64, 128),)),
        op("s", "Sum", ["mm"], out=((),)),
        op("big", "Placeholder", out=((64, 32, 32, 256),)),
        op("scale", "Mul", ["big", "s"], out=((64, 32, 32, 256),)),
        op("loss", "Sum", ["scale"], out=((),)),
    ])
    costs = TableCosts({"mm": 5e-3, "scale": 6e-3, "s": 1e-5, "loss": 1e-4})
    compile_graph = compiler(devs(2), costs, g)
    plan = os_dpos(g, compile_graph, 2)
    assert [s.op for s in plan.splits] == ["mm"]
    assert plan.makespan < dpos(compile_graph(g)).makespan - 2e-3
    check_schedule(plan.problem, plan.schedule)


def test_a_chain_of_splits_pays_where_one_alone_does_not():
    # Two element-wise ops in a row, 4 ms each; moving half the rows to the other device
    # costs 1.2 ms each way. One op split alone pays the cut and the join for 2 ms saved
    # (4 -> 1.2 + 2 + 1.2 = 4.4 ms); both split alike pay them once for 4 ms saved
    # (8 -> 1.2 + 4 + 1.2 = 6.4 ms), the second reading the first's parts.
    g = Graph([
        op("x", "Placeholder", out=((64, 1024),)),
        op("a", "Relu", ["x"], out=((64, 1024),)),
        op("b", "Relu", ["a"], out=((64, 1024),)),
        op("loss", "Sum", ["b"], out=((),)),
    ])
    half = 32 * 1024 * 4
    costs = TableCosts({"a": 4e-3, "b": 4e-3, "loss": 1e-5}, intercept=0.0, slope=1.2e-3 / half)
    compile_graph = compiler(devs(2), costs, g)
    before = dpos(compile_graph(g)).makespan
    plan = os_dpos(g, compile_graph, 2)
    assert [(s.op, s.dim, s.n) for s in plan.splits] == [("a", "batch", 2), ("b", "batch", 2)]
    assert plan.makespan == pytest.approx(before - 1.6e-3, abs=2e-4)
    # the second reads the first's parts: no join between them
    assert plan.graph["b/part1"].inputs[0].op == "a/part1" and "a" not in plan.graph
    check_schedule(plan.problem, plan.schedule)
    # and the split list replays the same graph, one split after the other
    assert sorted(apply_splits(g, plan.splits).names) == sorted(plan.graph.names)
