import random

import pytest

from fastt.costs.source import StaticCosts
from fastt.errors import FasttError
from fastt.sched import Problem, dpos
from fastt.sched.placers import baselines
from fastt.sched.placers import exact as exact_mod
from fastt.sched.sim.device_spec import parse
from fastt.sched.placers.exact import solve
from fastt.sched.strategy import plan
from tests.exact import check_schedule, optimal_makespan
from tests.helpers import training_graph
from tests.helpers import devs, random_problem


def free_links(p: Problem) -> Problem:
    edges = [(m, j, 0.0) for j in range(p.n) for m, _ in p.preds[j]]
    return Problem.build(p.n, edges, p.w, p.devices)


def test_the_program_finds_the_brute_force_optimum():
    rnd = random.Random(22)
    for _ in range(25):
        p = free_links(random_problem(rnd, homogeneous=rnd.random() < 0.5))
        r = solve(p, time_limit=30)
        check_schedule(p, r.schedule)
        assert r.optimal and r.gap == 0.0
        assert r.schedule.makespan == pytest.approx(optimal_makespan(p), rel=1e-6)
        assert r.lower_bound <= r.schedule.makespan + 1e-9


def test_with_transfers_it_is_never_worse_than_the_heuristics():
    rnd = random.Random(5)
    for _ in range(15):
        p = random_problem(rnd, homogeneous=False, memory=rnd.random() < 0.5)
        r = solve(p, time_limit=30)
        check_schedule(p, r.schedule)  # memory and colocation kept
        assert r.optimal
        for placer in (dpos, baselines.heft, baselines.m_etf, baselines.m_topo):
            try:
                other = placer(p)
            except FasttError:
                continue
            assert r.schedule.makespan <= other.makespan + 1e-9, placer.__name__


def test_a_transfer_dearer_than_the_parallelism_keeps_a_chain_together():
    # two ops after a source: apart they overlap, but the transfer costs more than that wins
    w = [[1.0, 1.0], [3.0, 3.0], [3.0, 3.0]]
    cheap = Problem.build(3, [(0, 1, 1.0), (0, 2, 1.0)], w, devs(2), intercept=0.5)
    dear = Problem.build(3, [(0, 1, 1.0), (0, 2, 1.0)], w, devs(2), intercept=4.0)
    assert solve(cheap).schedule.makespan == pytest.approx(4.5)
    assert solve(dear).schedule.makespan == pytest.approx(7.0)
    assert len(set(solve(dear).schedule.device)) == 1


def test_large_graphs_are_declined_and_the_strategy_plans_small_ones(monkeypatch):
    ds = parse("2xV100")
    g = training_graph(B=8)
    times = {o.name: 1e-3 * (5 if o.type in ("MatMul", "ReluGrad") else 1) for o in g}
    costs = StaticCosts(times, ds)
    s = plan(g, ds.devices, costs, "exact")
    assert set(s.placement) == set(s.graph.names)
    assert s.note.startswith("optimal (") or "% of HiGHS's bound" in s.note  # said in the CLI
    for name in ("heft", "m-etf", "m-topo", "m-sct", "single"):  # the model graph's placers
        assert s.predicted_step_time_s <= plan(g, ds.devices, costs, name
                                               ).predicted_step_time_s + 1e-12, name
    monkeypatch.setattr(exact_mod, "MAX_OPS", 5)
    with pytest.raises(FasttError, match="at most 5 ops; this one has"):
        plan(g, ds.devices, costs, "exact")
    assert plan(g, ds.devices, costs, "os-dpos").simulated_step_time_s > 0  # not its start


def test_under_a_deadline_the_program_gets_a_share_of_what_is_left(monkeypatch):
    from fastt.sched.search.osdpos import clock
    from fastt.sched.search.planning import Planning
    ds = parse("2xV100")
    g = training_graph(B=8)
    costs = StaticCosts({o.name: 1e-3 for o in g}, ds)
    late = Planning(g, ds.devices, costs, deadline=clock() - 1.0)
    with pytest.raises(FasttError, match="no time left for exact"):
        plan(g, ds.devices, None, "exact", shared=late)
    given = []
    monkeypatch.setattr(exact_mod, "solve", lambda p, t=None: given.append(t) or solve(p, 1.0))
    plan(g, ds.devices, None, "exact", shared=Planning(g, ds.devices, costs,
                                                      deadline=clock() + 12.0))
    plan(g, ds.devices, costs, "exact")
    assert 3.0 < given[0] <= 4.0 and given[1] == exact_mod.TIME_LIMIT_S


def test_a_solver_past_its_time_limit_is_stopped_and_the_list_schedule_kept(monkeypatch):
    """HiGHS checks its limit only between phases; a solver that never returns is stopped
    (here one that would sleep a minute, against a 1 s limit and 1 s of grace)."""
    import time
    rnd = random.Random(5)
    p = Problem.build(8, [(i, i + 1, 1e3) for i in range(7)],
                      [[rnd.uniform(1, 2)] * 2 for _ in range(8)], devs(2))
    monkeypatch.setattr(exact_mod, "milp", lambda *a, **k: time.sleep(60))
    r = solve(p, time_limit=1.0)
    assert r.seconds < 30 and not r.from_solver and not r.optimal
    assert r.schedule.makespan == pytest.approx(exact_mod._best_heuristic(p).makespan)

    def broken(*a, **k):
        raise ValueError("the solver's own error")
    monkeypatch.setattr(exact_mod, "milp", broken)  # an error in the solver's process is told
    with pytest.raises(ValueError, match="the solver's own error"):
        solve(p, time_limit=1.0)


def test_a_time_limit_returns_the_best_plan_with_an_honest_gap():
    rnd = random.Random(3)
    n, D = 40, 3
    edges = [(i, j, rnd.uniform(0, 1e6)) for i in range(n) for j in range(i + 1, n)
             if rnd.random() < 0.08]
    w = [[rnd.uniform(1, 10) for _ in range(D)] for _ in range(n)]
    p = Problem.build(n, edges, w, devs(D), intercept=0.5, slope=1e-6)
    r = solve(p, time_limit=0.5)
    check_schedule(p, r.schedule)
    assert r.schedule.makespan <= dpos(p).makespan + 1e-9
    assert 0.0 <= r.lower_bound <= r.schedule.makespan
    assert r.optimal or r.gap == pytest.approx(
        (r.schedule.makespan - r.lower_bound) / r.schedule.makespan)


def test_microsecond_steps_are_solved_as_well_as_second_ones():
    # the program works in units of its upper bound: a step of microsecond ops is not lost
    # below the solver's tolerances
    rnd = random.Random(9)
    for _ in range(5):
        p = free_links(random_problem(rnd, homogeneous=False))
        tiny = Problem.build(p.n, [(m, j, 0.0) for j in range(p.n) for m, _ in p.preds[j]],
                             [[t * 1e-6 for t in row] for row in p.w], p.devices)
        r = solve(tiny)
        assert r.optimal
        assert r.schedule.makespan == pytest.approx(optimal_makespan(tiny), rel=1e-6)
