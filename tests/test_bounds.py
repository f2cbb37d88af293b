import random

import pytest

from fastt.costs.source import StaticCosts
from fastt.ir import Graph
from fastt.sched import Problem
from fastt.sched.search.bounds import least_shares, lower_bound
from fastt.sched.sim.device_spec import parse
from fastt.sched.registry import names
from fastt.sched.search.planning import Planning
from fastt.sched.strategy import plan
from tests.exact import optimal_makespan
from tests.helpers import op
from tests.helpers import devs, random_problem
from tests.helpers import training_graph


def test_bound_is_the_chain_or_the_work_and_never_above_the_optimum():
    chain = Problem.build(3, [(0, 1, 0.0), (1, 2, 0.0)], [[2.0, 3.0], [1.0, 1.0], [4.0, 2.0]],
                          devs(2))
    b = lower_bound(chain)
    assert (b.critical_path, b.work, b.value) == (5.0, 2.5, 5.0)  # each op on its fastest
    assert lower_bound(chain, {"op1": 0.5}).critical_path == 4.5  # a divisible op: its share
    apart = Problem.build(4, [], [[3.0, 3.0]] * 4, devs(2))
    assert lower_bound(apart).value == 6.0 == optimal_makespan(apart)  # the work, shared
    assert lower_bound(apart, {"op0": 0.0}).work == 4.5  # a folded op does no work
    rnd = random.Random(7)
    for _ in range(100):
        p = random_problem(rnd, homogeneous=rnd.random() < 0.5)
        assert lower_bound(p).value <= optimal_makespan(p) + 1e-9


def test_shares_name_what_fastt_can_cut_and_fold():
    g = training_graph(B=8)
    shares = least_shares(g, 4)
    types = {o.name: o.type for o in g}
    assert {types[n] for n, k in shares.items() if k == 0.25} >= {"MatMul"}
    from fastt.passes.data_parallel import data_parallel
    dp = data_parallel(g, 4)
    more = least_shares(g, 4, dp)
    parts = {o.meta.origin for o in dp if o.meta.origin and o.meta.fraction < 1}
    assert parts and all(more[n] == (0.0 if types[n] == "Shape" else 0.25) for n in parts)
    assert set(shares) <= set(more) and set(more.values()) <= {0.0, 0.25}
    shaped = Graph(list(g) + [op("s", "Shape", [g.names[0]], out=((2,),), dtype="int32")])
    assert least_shares(shaped, 4)["s"] == 0.0


@pytest.mark.parametrize("spec", ["2xV100", "4xV100", "2x4xV100"])
def test_no_strategy_beats_the_bound(spec):
    ds = parse(spec)
    g = training_graph(B=16)
    times = {o.name: 1e-3 * (5 if o.type in ("MatMul", "ReluGrad") else 1) for o in g}
    costs = StaticCosts(times, ds)
    shared = Planning(g, ds.devices, costs)
    bound = shared.bound()
    # not trivial: the single device's step (less the shape ops fastt folds) over the devices
    single = plan(g, ds.devices, costs, "single", shared=shared)
    folded = sum(times[o.name] for o in g if o.type == "Shape")
    assert bound.work == pytest.approx((single.predicted_step_time_s - folded) / len(ds.devices))
    for name in names():
        s = plan(g, ds.devices, costs, name, shared=shared)
        assert bound.value <= s.predicted_step_time_s + 1e-12, name
    assert bound.critical_path > 0 and bound.work > 0
