"""Hybrid data/model parallelism (``fastt.passes.hybrid``): weights kept whole on one device
while the rest of the step stays data parallel. The rewritten graphs' equivalence runs in a
process of its own (``tests/equivalence.py --hybrid``)."""
import pytest

from fastt.costs.source import StaticCosts
from fastt.errors import Declined
from fastt.ir import Graph
from fastt.passes.allreduce import all_reduce, mirrors
from fastt.passes.data_parallel import data_parallel
from fastt.passes.replicas import replica_of
from fastt.sched.sim.device_spec import DeviceSet
from fastt.passes.hybrid import Weight, keep_whole, kept_whole, promising, weights
from fastt.sched.search.planning import Planning
from fastt.sched.sim.problem import Device
from fastt.sched.registry import KINDS
from fastt.sched.search.starts import hybrid
from fastt.sched.strategy import plan
from tests.helpers import equivalence, op

B, WIDE = 8, 4096


def two_layers(B: int = B) -> Graph:
    """x[B,64] -> h1 = x w1 (w1: 1 MB, much compute) -> relu -> h2 = a1 w2 (w2: 64 MB, little
    compute) -> mean; the gradients as ``tf.gradients`` makes them, SGD updates."""
    def var(name, shape):
        return [op(name, "VarHandleOp", out=((),), dtype="resource", is_variable=True),
                op(f"{name}/read", "ReadVariableOp", [name], out=(shape,))]
    return Graph([
        op("x", "Placeholder", out=((B, 64),)),
        *var("w1", (64, WIDE)), *var("w2", (WIDE, WIDE)),
        op("h1", "MatMul", ["x", "w1/read"], out=((B, WIDE),)),
        op("a1", "Relu", ["h1"], out=((B, WIDE),)),
        op("h2", "MatMul", ["a1", "w2/read"], out=((B, WIDE),)),
        op("axes", "Const", out=((2,),), dtype="int32", attrs={"value": [0, 1]}),
        op("loss", "Mean", ["h2", "axes"], out=((),)),
        op("dh2", "Mul", ["h2", "h2"], out=((B, WIDE),)),
        op("dw2", "MatMul", ["a1", "dh2"], out=((WIDE, WIDE),), attrs={"transpose_a": True}),
        op("da1", "MatMul", ["dh2", "w2/read"], out=((B, WIDE),), attrs={"transpose_b": True}),
        op("dh1", "ReluGrad", ["da1", "a1"], out=((B, WIDE),)),
        op("dw1", "MatMul", ["x", "dh1"], out=((64, WIDE),), attrs={"transpose_a": True}),
        op("lr", "Const", out=((),)),
        op("update1", "ResourceApplyGradientDescent", ["w1", "lr", "dw1"], out=(),
           stateful=True),
        op("update2", "ResourceApplyGradientDescent", ["w2", "lr", "dw2"], out=(),
           stateful=True),
    ])


def test_a_weight_is_the_ops_that_read_it_and_make_its_gradient():
    found = {w.variable: w for w in weights(two_layers())}
    assert set(found) == {"w1", "w2"}
    assert found["w2"].ops == {"h2", "da1", "dw2"} and found["w2"].nbytes == WIDE * WIDE * 4
    assert found["w1"].ops == {"h1", "dw1"}


def test_activations_of_a_weight_s_size_are_not_part_of_its_gradient():
    """At a batch of WIDE rows the activations a1 and dh2 have w2's size: the trace back from
    w2's update stops at the MatMul that makes its gradient."""
    found = {w.variable: w for w in weights(two_layers(B=WIDE))}
    assert found["w2"].ops == {"h2", "da1", "dw2"}
    assert found["w1"].ops == {"h1", "dw1"}


def test_a_weight_kept_whole_is_neither_replicated_nor_mirrored():
    g = two_layers()
    w2 = next(w for w in weights(g) if w.variable == "w2")
    dp = data_parallel(g, 2, whole=w2.ops)
    for name in w2.ops:  # once, on the whole batch: its gradient is never summed
        assert dp[name].type == "MatMul" and replica_of(dp[name]) is None
        assert f"{name}/part0" not in dp
    assert dp["update2"].inputs[2].op == "dw2"
    assert "h1/part1" in dp and dp["dw1"].type == "AddN"  # the other layer stays replicated
    assert kept_whole(g, dp) == ["w2"] and kept_whole(g, data_parallel(g, 2)) == []
    # in the all-reduce layout only the replicated weight gets copies
    assert set(mirrors(all_reduce(dp, 2))) == {"w1"}
    assert set(mirrors(all_reduce(data_parallel(g, 2), 2))) == {"w1", "w2"}


def test_promising_weights_send_more_than_they_would_compute():
    small = Weight("small", 1_000, frozenset({"a"}))
    big = Weight("big", 100_000_000, frozenset({"b"}))
    compute = {"small": 0.010, "big": 0.001}
    # 1 GB/s: 'big' sends 200 ms of gradients a step for 1 ms of compute; 'small' 2 us for 10
    kept = promising([small, big], lambda w: compute[w.variable], 1e-9, 2)
    assert kept == [big]


def test_keep_whole_keeps_what_shortens_the_step_greedily():
    a, b, c = (Weight(n, 1, frozenset({n})) for n in "abc")
    gain = {"a": 0.3, "b": -0.1, "c": 0.2}  # b alone makes the step longer

    def build(whole):
        return Graph([op(n) for n in sorted(whole)])

    def step_time(g):
        return 1.0 - sum(gain[n] for n in g.names)
    best, kept = keep_whole([a, b, c], build, step_time)
    assert kept == [a, c] and sorted(best.names) == ["a", "c"]
    # nothing fits: nothing kept
    assert keep_whole([a], lambda whole: None, step_time) == (None, [])


def _devices(bandwidth):
    """Two workers' CPUs (processes of their own: they share no cores)."""
    devices = [Device(f"/job:worker/replica:0/task:{k}/device:CPU:0") for k in range(2)]
    return devices, DeviceSet("CPU", devices, {(a.name, b.name): (1e-5, bandwidth)
                                               for a in devices for b in devices if a != b})


def test_os_dpos_keeps_a_large_light_weight_whole_where_its_gradient_would_cross_a_slow_link():
    g = two_layers()
    devices, ds = _devices(1e9)  # 64 MB of gradient: 64 ms on the link
    seconds = {"h1": 0.020, "dw1": 0.020, "da1": 0.001, "h2": 0.001, "dw2": 0.001}
    shared = Planning(g, devices, StaticCosts(seconds, ds), copy_bytes_per_s=ds.copy_bytes_per_s)
    got = {name: plan(g, devices, None, name, shared=shared)
           for name in ("os-dpos", "data-parallel", "data-parallel-ps", "single")}
    chosen = got["os-dpos"]
    assert chosen.kept_whole == ["w2"] and chosen.replicas == 2
    assert chosen.to_dict()["kept_whole"] == ["w2"]
    for name in ("data-parallel", "data-parallel-ps", "single"):
        assert chosen.simulated_step_time_s < 0.9 * got[name].simulated_step_time_s, name
    # with a fast link the same weight is replicated: nothing is kept whole
    devices, ds = _devices(1e12)
    fast = plan(g, devices, StaticCosts(seconds, ds), "os-dpos")
    assert fast.kept_whole == [] and fast.replicas == 2


def test_hybrid_plans_train_as_the_original():
    """Both layouts with every other weight kept whole, in-process and on a 2-worker cluster
    (``tests/equivalence.py --hybrid``)."""
    assert equivalence("--hybrid").count("hybrid plans train as the original") == 4


def test_no_candidate_is_begun_past_the_budget():
    a, b = (Weight(n, 1, frozenset({n})) for n in "ab")
    built = []

    def build(whole):
        built.append(sorted(whole))
        return Graph([op(n) for n in sorted(whole)])
    # each candidate said to take 15 s against a 20 s budget: the first only
    keep_whole([a, b], build, lambda g: -len(g), budget_s=20.0, candidate_s=15.0)
    assert built == [[], ["a"]]


def test_the_searches_aim_a_reserve_before_the_deadline(monkeypatch):
    """``Planning.deadline``: what the searches and finishes aim at leaves ``RESERVE_SHARE`` of
    the time left when planning begins (none when it is past already)."""
    from fastt.sched.search import planning
    monkeypatch.setattr(planning, "clock", lambda: 100.0)
    devices, ds = _devices(1e9)
    aimed = Planning(two_layers(), devices, StaticCosts({}, ds), deadline=160.0).deadline
    assert aimed == pytest.approx(160.0 - planning.RESERVE_SHARE * 60.0) and aimed < 160.0
    assert Planning(two_layers(), devices, StaticCosts({}, ds), deadline=90.0).deadline == 90.0
    assert Planning(two_layers(), devices, StaticCosts({}, ds)).deadline is None


def test_work_built_while_building_other_work_is_counted_once(monkeypatch):
    """``Planning.built_s``: the seconds of a piece of work built inside another named with
    it are in that one's, not added again."""
    from fastt.sched.search import planning
    now = [0.0]
    monkeypatch.setattr(planning, "clock", lambda: now[0])
    devices, ds = _devices(1e9)
    shared = Planning(two_layers(), devices, StaticCosts({}, ds))

    def inner():
        now[0] += 2.0
        return "inner"

    def outer():
        now[0] += 1.0
        shared.cached(("inner",), inner)
        now[0] += 3.0
        return "outer"
    shared.cached(("outer",), outer)
    assert shared.built_s(("outer",)) == 6.0 and shared.built_s(("inner",)) == 2.0
    assert shared.built_s(("outer",), ("inner",)) == 6.0
    assert shared.built_s(("inner",), ("missing",)) == 2.0


@pytest.mark.parametrize("name", ["data-parallel", "data-parallel-ps"])
def test_a_hybrid_candidate_is_taken_to_cost_its_compile_place_and_replay(monkeypatch, name):
    """A candidate of the hybrid search builds a data-parallel graph, compiles, places and
    replays it: its expected time counts each of these once, whether the layout's graph was
    compiled before the layout (TF-slim's replicas, compiled while the placers of the model
    graph run aside) or while it was built (the all-reduce graph); a search whose candidate
    would end past its share of the deadline declines, saying so."""
    from fastt.sched.search import planning, starts
    now = [0.0]
    monkeypatch.setattr(planning, "clock", lambda: now[0])
    monkeypatch.setattr(starts, "clock", lambda: now[0])
    g = two_layers()
    devices, ds = _devices(1e9)
    seconds = {"h1": 0.020, "dw1": 0.020, "da1": 0.001, "h2": 0.001, "dw2": 0.001}
    shared = Planning(g, devices, StaticCosts(seconds, ds), copy_bytes_per_s=ds.copy_bytes_per_s,
                      deadline=30.0)
    shared.deadline = 30.0  # what the searches aim at (no reserve: it is not tested here)
    compile_graph = shared.compile_graph

    def slow_compile(graph):  # every compile takes 5 s of the fake clock, nothing else any
        now[0] += 5.0
        return compile_graph(graph)
    shared.compile_graph = slow_compile
    shared.compile(g)  # as ``place_aside`` does, before the layouts
    shared.compile(shared.replicas())
    g0 = starts.layout(shared, name)[0]
    shared.replay(shared.compile(g0), shared.place(KINDS[name], g0))
    assert starts.hybrid_candidate_s(shared, name) == 5.0
    now[0] = 0.0  # 30 s left, a third of it for the hybrid search: a 5 s candidate may
    assert shared.budget(20.0, 1 / 3) == 10.0  # begin, ...
    now[0] = 20.0  # ... with 10 s left (3.3 s for the search) it may not
    with pytest.raises(Declined, match=r"a candidate takes about 5 s; 3 s left"):
        hybrid(shared, name)


def test_a_plan_past_its_deadline_skips_the_searches_but_not_the_baselines(caplog):
    """``fastt plan --budget``: with no time left the hybrid search declines (saying why) and
    the split search begins no candidate; the starting plans every strategy needs are still
    made, so OS-DPOS is no slower than any of them."""
    import logging

    from fastt.sched.search.osdpos import clock
    g = two_layers()
    devices, ds = _devices(1e9)
    seconds = {"h1": 0.020, "dw1": 0.020, "da1": 0.001, "h2": 0.001, "dw2": 0.001}
    shared = Planning(g, devices, StaticCosts(seconds, ds), copy_bytes_per_s=ds.copy_bytes_per_s,
                      deadline=clock() - 1.0)
    assert shared.budget(20.0, 1 / 3) == 0.0
    with caplog.at_level(logging.INFO, logger="fastt"):
        got = {name: plan(g, devices, None, name, shared=shared)
               for name in ("os-dpos", "data-parallel", "data-parallel-ps", "single")}
    chosen = got["os-dpos"]
    assert chosen.kept_whole == [] and chosen.dpos_runs <= 8  # its starts, no candidate
    with pytest.raises(Declined, match="no time left to keep weights whole"):
        hybrid(shared, "data-parallel")
    for name in ("data-parallel", "data-parallel-ps", "single"):
        assert chosen.simulated_step_time_s <= got[name].simulated_step_time_s, name
    assert Planning(g, devices, StaticCosts(seconds, ds)).budget(20.0, 1 / 3) == 20.0


def test_past_its_deadline_os_dpos_finishes_its_plans_with_what_is_known(monkeypatch):
    """No weight-transfer ordering or first-come replay is begun for OS-DPOS's plans past
    the deadline; the baselines, planned first, are finished (their transfers ordered where
    that may beat the fastest plan replayed: ``Planning.may_win``), so OS-DPOS (which starts
    from them) is still no slower than any."""
    from fastt.sched.search import planning
    from fastt.sched.search.osdpos import clock
    calls = []
    real = planning.prioritize
    monkeypatch.setattr(planning, "prioritize",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    g = two_layers()
    devices, ds = _devices(1e9)
    seconds = {"h1": 0.020, "dw1": 0.020, "da1": 0.001, "h2": 0.001, "dw2": 0.001}
    shared = Planning(g, devices, StaticCosts(seconds, ds), copy_bytes_per_s=ds.copy_bytes_per_s,
                      deadline=clock() - 1.0)
    got = {name: plan(g, devices, None, name, shared=shared)
           for name in ("data-parallel", "data-parallel-ps", "single", "dpos")}
    assert len(calls) <= 4  # at most each baseline's own finish
    before = set(shared._built)
    chosen = plan(g, devices, None, "os-dpos", shared=shared)
    begun = {k[0] for k in set(shared._built) - before}
    assert not calls[4:] and not begun & {"prioritized", "fifo"}, begun
    for name, s in got.items():
        assert chosen.simulated_step_time_s <= s.simulated_step_time_s, name


def test_a_finish_expected_to_end_past_the_deadline_is_not_begun(monkeypatch):
    """Before the deadline, OS-DPOS still begins no weight-transfer ordering or first-come
    replay for a plan whose finish (about what compiling a graph of its size takes) would
    end past it, its first plan included."""
    from fastt.sched.search.osdpos import clock
    g = two_layers()
    devices, ds = _devices(1e9)
    seconds = {"h1": 0.020, "dw1": 0.020, "da1": 0.001, "h2": 0.001, "dw2": 0.001}
    shared = Planning(g, devices, StaticCosts(seconds, ds), copy_bytes_per_s=ds.copy_bytes_per_s,
                      deadline=clock() + 600.0)
    for name in ("data-parallel", "data-parallel-ps", "single", "dpos"):
        plan(g, devices, None, name, shared=shared)
    compiles = [(v, seconds) for k, (v, seconds, _) in shared._built.items()
                if k[0] == "compile"]
    slowest = max(compiles, key=lambda c: c[1] / c[0].n)
    assert shared.finish_s(slowest[0]) == pytest.approx(slowest[1])  # its own compile's time
    monkeypatch.setattr(Planning, "finish_s", lambda self, p: 1e6)  # a huge graph's
    before = set(shared._built)
    plan(g, devices, None, "os-dpos", shared=shared, split=False)
    begun = {k[0] for k in set(shared._built) - before}
    assert not begun & {"prioritized", "fifo"}, begun


def test_late_means_work_of_the_expected_length_would_end_past_the_deadline():
    from fastt.sched.search.osdpos import clock
    devices, ds = _devices(1e9)
    costs = StaticCosts({}, ds)
    soon = Planning(two_layers(), devices, costs, deadline=clock() + 5.0)
    assert not soon.late() and not soon.late(1.0) and soon.late(10.0)
    assert not Planning(two_layers(), devices, costs).late(1e9)  # no deadline
