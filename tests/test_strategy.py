import json
import math

import pytest

from fastt.errors import DoesNotFit, FasttError
from fastt.ir import Graph
from fastt.costs.source import StaticCosts
from fastt.sched.sim.device_spec import parse
from fastt.passes.splitting import Split
from fastt.sched.registry import names
from fastt.passes.data_parallel import data_parallel
from fastt.sched.search.memory_fit import data_parallel_fitting, peak_memory_one_device
from fastt.sched.strategy import plan
from tests.helpers import costs, op, training_graph


@pytest.mark.parametrize("name", names())
def test_every_strategy_places_and_orders_every_op(name):
    ds = parse("2xV100")
    g = training_graph(B=8)
    s = plan(g, ds.devices, costs(ds, g), name)
    assert set(s.placement) == set(s.graph.names) == set(s.order)
    assert set(s.placement.values()) <= set(s.devices)
    assert s.predicted_step_time_s > 0 and s.simulated_step_time_s >= s.predicted_step_time_s
    doc = json.loads(json.dumps(s.to_dict()))
    assert {"strategy", "devices", "predicted_step_time_s", "plan_time_s", "splits",
            "placement", "order"} <= set(doc)


@pytest.mark.parametrize("spec", ["2xV100", "4xV100", "2x4xV100"])
def test_os_dpos_is_never_simulated_slower_than_any_registered_strategy(spec):
    # OS-DPOS starts from every placer of the registry, so none can beat it
    ds = parse(spec)
    g = training_graph(B=16)
    c = costs(ds, g)
    got = {n: plan(g, ds.devices, c, n).simulated_step_time_s for n in names()}
    assert len(got) == len(names()) >= 8
    assert all(got["os-dpos"] <= t + 1e-12 for t in got.values()), got
    assert plan(g, ds.devices, c, "data-parallel").replicas == len(ds.devices)


def test_os_dpos_keeps_everything_on_one_device_when_links_are_too_slow():
    ds = parse("2xV100")
    g = training_graph(B=16)
    slow = {k: (1.0, 1e-3) for k in ds.links}  # a second per transfer
    ds.links.update(slow)
    c = costs(ds, g)
    s = plan(g, ds.devices, c, "os-dpos")
    assert len(set(s.placement.values())) == 1
    assert s.predicted_step_time_s == pytest.approx(
        plan(g, ds.devices, c, "single").predicted_step_time_s)
    assert plan(g, ds.devices, c, "dpos").predicted_step_time_s > s.predicted_step_time_s


def test_os_dpos_keeps_one_device_when_its_spread_would_queue_on_the_link():
    # a fans 8 one-megabyte tensors out to 8 one-millisecond ops: DPOS's contention-free
    # model sends half of them to the other device at once; one at a time they arrive late.
    k = 8
    g = Graph([op("a", out=[(250_000,)] * k)] + [op(f"b{i}", inputs=[f"a:{i}"]) for i in
                                                  range(k)] +
              [op("j", "AddN", [f"b{i}" for i in range(k)])])
    ds = parse("2xV100")
    ds.links.update({pair: (0.0, 0.25e9) for pair in ds.links})
    c = StaticCosts({**{f"b{i}": 1e-3 for i in range(k)}, "a": 1e-4}, ds)
    spread, single = plan(g, ds.devices, c, "dpos"), plan(g, ds.devices, c, "single")
    assert len(set(spread.placement.values())) == 2
    assert spread.predicted_step_time_s < single.predicted_step_time_s
    assert spread.simulated_step_time_s > single.simulated_step_time_s
    s = plan(g, ds.devices, c, "os-dpos")
    assert len(set(s.placement.values())) == 1
    assert s.simulated_step_time_s == pytest.approx(single.simulated_step_time_s)


def test_os_dpos_keeps_the_replicas_when_dpos_cannot_place_their_graph(monkeypatch):
    # DPOS reserves memory op by op (no frees): it can refuse a graph whose replicas fit.
    import dataclasses

    from fastt.errors import DoesNotFit
    from fastt.sched import registry

    def no_room(p):
        raise DoesNotFit("fits in no device's remaining memory")
    ds = parse("4xV100")
    g = training_graph(B=16)
    dp = plan(g, ds.devices, costs(ds, g), "data-parallel")
    monkeypatch.setitem(registry.KINDS, "dpos", dataclasses.replace(
        registry.KINDS["dpos"], place=lambda p, _: no_room(p)))
    s = plan(g, ds.devices, costs(ds, g), "os-dpos", split=False)
    assert s.replicas == 4
    assert s.simulated_step_time_s == pytest.approx(dp.simulated_step_time_s)
    with pytest.raises(FasttError, match="no device's remaining memory"):
        plan(g, ds.devices, costs(ds, g), "dpos")


def test_data_parallel_needs_the_model_to_fit():
    ds = parse("2xV100")
    g = training_graph()
    tiny = [d.__class__(d.name, 10.0) for d in ds.devices]
    assert tiny[0].memory < peak_memory_one_device(g) <= ds.devices[0].memory
    with pytest.raises(FasttError, match="fit one device"):
        plan(g, tiny, costs(ds, g), "data-parallel")
    with pytest.raises(FasttError, match="split list cannot be combined"):
        plan(g, ds.devices, costs(ds, g), "data-parallel", splits=[Split("h", "batch", 2)])
    with pytest.raises(FasttError, match="unknown strategy 'fastest'"):
        plan(g, ds.devices, costs(ds, g), "fastest")


def test_data_parallel_needs_only_each_replica_to_fit():
    # Weak scaling: the whole batch does not fit one device, each replica's share does.
    ds = parse("4xV100")
    g = training_graph(B=64)
    whole, share = peak_memory_one_device(g), peak_memory_one_device(training_graph(B=16))
    assert share < whole
    room = [d.__class__(d.name, (share + whole) / 2) for d in ds.devices]
    assert peak_memory_one_device(g) > room[0].memory  # the whole batch does not fit
    assert data_parallel_fitting(g, room) is not None
    assert plan(g, room, costs(ds, g), "os-dpos").replicas == 4
    tiny = [d.__class__(d.name, share / 10) for d in ds.devices]
    assert data_parallel_fitting(g, tiny) is None


def test_device_specs(tmp_path):
    ds = parse("2x4xV100")
    assert len(ds.devices) == 8
    assert ds.devices[4].name == "/job:worker/replica:0/task:1/device:GPU:0"
    assert ds.devices[0].memory == 16 * 2**30
    near, far = ds.link(ds.devices[0].name, ds.devices[1].name), \
        ds.link(ds.devices[0].name, ds.devices[4].name)
    assert far[1] > near[1]  # the inter-server link is slower (more seconds per byte)
    assert parse("8xV100:pcie").link(parse("8xV100").devices[0].name,
                                     parse("8xV100").devices[1].name)[1] > near[1]
    f = tmp_path / "d.json"
    f.write_text(json.dumps({"kind": "P100", "devices": [{"name": "/gpu:0", "memory": 1e9},
                                                        {"name": "/gpu:1"}],
                             "pairs": [{"src": "/gpu:0", "dst": "/gpu:1",
                                        "bandwidth_gbps": 1, "latency_us": 100}]}))
    fs = parse(str(f))
    assert fs.devices[1].memory == math.inf
    assert fs.link(fs.devices[0].name, fs.devices[1].name) == pytest.approx((1e-4, 1e-9))
    for bad, msg in (("4xH999", "unknown kind"), ("four GPUs", "expected e.g."),
                     (str(tmp_path / "none.json"), "does not exist")):
        with pytest.raises(FasttError, match=msg):
            parse(bad)
    (tmp_path / "bad.json").write_text('{"devices": [{"nom": 1}]}')
    with pytest.raises(FasttError, match="KeyError"):
        parse(str(tmp_path / "bad.json"))


@pytest.mark.parametrize("spec", ["2xV100", "2x4xV100"])
def test_strategies_sharing_a_planning_are_those_planned_alone(spec, monkeypatch):
    # one Planning for every strategy: the same plans, the data-parallel replicas (and each
    # count of micro-batches) built once
    import fastt.sched.search.planning as strategy
    ds = parse(spec)
    g = training_graph(B=16)
    c = costs(ds, g)
    alone = {n: plan(g, ds.devices, c, n) for n in names()}
    built = []
    real = strategy.data_parallel
    monkeypatch.setattr(strategy, "data_parallel", lambda *a: built.append(a) or real(*a))
    shared = strategy.Planning(g, ds.devices, c)
    for n in names():
        s = plan(g, ds.devices, c, n, shared=shared)
        a = alone[n]
        assert (s.placement, s.order, s.replicas, s.splits) == \
            (a.placement, a.order, a.replicas, a.splits), n
        assert (s.predicted_step_time_s, s.simulated_step_time_s) == \
            (a.predicted_step_time_s, a.simulated_step_time_s), n
        assert s.plan_time_s > 0
    counts = [a[1] for a in built]
    D = len(ds.devices)
    assert sorted(counts) == sorted(set(counts)) and D in counts
    assert set(counts) <= {D, 2 * D, 4 * D}


def test_a_planning_says_again_why_a_layout_does_not_fit():
    import fastt.sched.search.planning as strategy
    ds = parse("2xV100")
    g = training_graph(B=16)
    tiny = [d.__class__(d.name, 10.0) for d in ds.devices]  # no replica fits
    shared = strategy.Planning(g, tiny, costs(ds, g))
    for _ in range(2):
        with pytest.raises(DoesNotFit, match="every replica"):
            plan(g, tiny, costs(ds, g), "data-parallel", shared=shared)


def test_os_dpos_keeps_its_order_only_where_the_simulator_says_it_pays(monkeypatch):
    from fastt.sched.search import planning
    from fastt.sched import strategy as st
    ds = parse("2xV100")
    g = training_graph(B=16)
    c = costs(ds, g)
    planned = plan(g, ds.devices, c, "os-dpos")
    assert planned.ordered and planned.to_dict()["ordered"] is True  # its order is faster here
    replayed = planning.Planning._replayed
    assert all(f > planned.simulated_step_time_s for f in [
        st.replay(planned, ds.devices, c, g, link_concurrency=1, fifo=True)[1].makespan])

    def faster_fifo(self, p, s, ordered):
        times, start = replayed(self, p, s, ordered)
        return (times if ordered else tuple(0.5 * t for t in times)), start
    # where the first-come order runs the same placement faster, that order is kept
    monkeypatch.setattr(planning.Planning, "_replayed", faster_fifo)
    faster = plan(g, ds.devices, c, "os-dpos")
    assert not faster.ordered and faster.placement == planned.placement
    assert faster.simulated_step_time_s < planned.simulated_step_time_s
    assert plan(g, ds.devices, c, "dpos").ordered  # DPOS stays pure DPOS
    from fastt.inspect import trace  # its predicted step is drawn in the order it keeps
    for s, fifo_order in ((planned, False), (faster, True)):
        shown = trace.predicted(s, ds.devices, c, g)["otherData"]["fastt"]["step_time_s"]
        assert shown == st.replay(s, ds.devices, c, g, fifo=fifo_order)[1].makespan


def test_a_deadline_builds_no_more_micro_batches_than_it_can_pay_for():
    """Past its deadline a plan starts pipelines from the data-parallel replicas only (m = the
    devices); without one, from 2 and 4 times as many micro-batches too; what was built is
    used either way, so the pipeline strategy and OS-DPOS see the same graphs."""
    from fastt.sched.search.osdpos import clock
    from fastt.sched.search.planning import Planning
    from fastt.sched.search.starts import micro_batched
    ds = parse("2xV100")
    g = training_graph(B=16)
    free = Planning(g, ds.devices, costs(ds, g))
    assert [m for _, m, _ in micro_batched(free)] == [2, 4, 8]
    late = Planning(g, ds.devices, costs(ds, g), deadline=clock() - 1.0)
    assert [m for _, m, _ in micro_batched(late)] == [2]
    late.cached(("micro", 4), lambda: micro_batched(free)[1][0])  # built before: kept
    assert [m for _, m, _ in micro_batched(late)] == [2, 4]
    assert plan(g, ds.devices, None, "os-dpos", shared=late).simulated_step_time_s <= \
        plan(g, ds.devices, None, "pipedream", shared=late).simulated_step_time_s


def test_the_memory_check_replays_the_planners_problem_in_units_of_time():
    """``unit_costs`` of the planner's compiled layout is the problem compiled with unit
    costs: the same peaks, so the same verdict, without compiling twice."""
    from fastt.costs.memory import MemoryModel
    from fastt.sched.placers import baselines
    from fastt.passes.allreduce import all_reduce
    from fastt.sched.search.osdpos import compiler
    from fastt.sched.search.memory_fit import _UnitCosts, unit_costs
    from fastt.sched.sim.problem import Problem
    from fastt.sched.sim.simulate import simulate
    from tests.helpers import momentum_graph
    ds = parse("4xV100")
    g = momentum_graph()
    dp = all_reduce(data_parallel(g, 4), 4, collective=True)

    def peaks(p):
        device = baselines.data_parallel(p, dp).device
        orders = [[i for i in p.topo if device[i] == d] for d in range(4)]
        return simulate(p, device, orders).peak_memory
    compiled = compiler(ds.devices, costs(ds, g), g)(dp)
    assert any(s == 1 for s in compiled.stream)  # collectives: their ring is free in units
    direct = Problem.from_graph(dp, ds.devices, _UnitCosts(),
                                persistent=MemoryModel.from_graph(dp).persistent)
    units = unit_costs(compiled)
    assert (units.names, units.w, units.intercept, units.slope, units.send_cpu,
            units.recv_cpu, units.reach, units.persistent, units.edge_tensors) == \
        (direct.names, direct.w, direct.intercept, direct.slope, direct.send_cpu,
         direct.recv_cpu, direct.reach, direct.persistent, direct.edge_tensors)
    assert peaks(units) == peaks(direct)
    room = [d.__class__(d.name, max(peaks(direct)) * 1.01) for d in ds.devices]
    less = [d.__class__(d.name, max(peaks(direct)) * 0.99) for d in ds.devices]
    for devices, fits in ((room, True), (less, False)):
        got = data_parallel_fitting(g, devices, compile_graph=compiler(devices, costs(ds, g), g))
        assert (got is not None) == fits


def test_equal_plans_are_replayed_and_ordered_once_whichever_strategy_made_them(monkeypatch):
    """Planning's replays and transfer orderings are keyed by the plan (placement, and order
    where it is enforced), not by the schedule object: PipeDream's single replicated stage
    and TF-slim's data parallelism end on the same plan of the same replicas."""
    import fastt.sched.search.planning as planning
    from fastt.sched.sim.schedule import Schedule
    ds = parse("2xV100")
    g = training_graph(B=8)
    shared = planning.Planning(g, ds.devices, costs(ds, g))
    p = shared.compile(g)
    calls = []
    real = planning.replay_runs
    monkeypatch.setattr(planning, "replay_runs", lambda *a: calls.append(a) or real(*a))
    def in_order(order, device):  # a schedule running ``order``, op k at time k
        start = [0.0] * p.n
        for k, i in enumerate(order):
            start[i] = float(k)
        return Schedule(list(device), start, [t + 0.5 for t in start])
    indegree, ready, last_first = [len(x) for x in p.preds], [], []
    ready = [i for i in range(p.n) if not indegree[i]]
    while ready:  # another topological order: the highest index ready first
        i = max(ready)
        ready.remove(i)
        last_first.append(i)
        for j, _ in p.succs[i]:
            indegree[j] -= 1
            if not indegree[j]:
                ready.append(j)
    s1 = in_order(p.topo, [0] * p.n)
    same = in_order(p.topo, [0] * p.n)
    reordered = in_order(last_first, [0] * p.n)
    assert reordered.order() != s1.order()
    moved = in_order(p.topo, [i % 2 for i in range(p.n)])
    assert shared.replay(p, s1) == shared.replay(p, same) and len(calls) == 1
    shared.replay_fifo(p, s1)
    shared.replay_fifo(p, reordered)  # the same placement: first come, first served alike
    assert len(calls) == 2
    shared.replay(p, reordered)
    shared.replay(p, moved)
    assert len(calls) == 4
    assert shared.prioritized(g, p, s1, True, shared.replay(p, s1)) is \
        shared.prioritized(g, p, same, True, shared.replay(p, same))


def test_placed_aside_is_placed_as_here(monkeypatch):
    """``place_first``: the placers of the model graph, of the micro-batched graphs and of
    TF-slim's layout on the replicas (its own and DPOS) run in a forked process
    (``Planning.place_aside``), each replayed there; once joined their schedules and replays
    are those of this process, kept as built (not placed or replayed again), and misfits
    kept as such."""
    import os

    from fastt.sched.search.planning import Planning
    from fastt.sched.sim.problem import Device
    from fastt.sched.registry import KINDS
    from fastt.sched.search.starts import micro_batched
    from fastt.sched.strategy import place_first
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    ds = parse("2xV100")
    g = training_graph(B=16)
    c = costs(ds, g)
    kinds = [KINDS[n] for n in names() if not KINDS[n].search and not KINDS[n].timed]
    here = Planning(g, ds.devices, c)
    aside = Planning(g, ds.devices, c, deadline=math.inf)
    jobs = [(k, g) for k in kinds if k.starts in ("model", "both")] + \
        [(KINDS["pipedream"], m) for m, _, _ in micro_batched(aside)] + \
        [(KINDS[n], aside.replicas()) for n in ("data-parallel-ps", "dpos")]
    calls = []
    real = Planning.place_aside
    from fastt.sched.search import planning
    replays, replayed_after = planning.replay_runs, []

    def record(p, device, order):
        replayed_after.append((id(p), tuple(device), order and tuple(order)))
        return replays(p, device, order)

    def placing_aside(self, js):
        calls.append([(k.name, id(m)) for k, m in js])
        join = real(self, js)

        def joined():
            join()  # what is replayed here from now on is seen
            monkeypatch.setattr(planning, "replay_runs", record)
        return joined
    monkeypatch.setattr(Planning, "place_aside", placing_aside)
    place_first(aside, kinds)
    assert calls == [[(k.name, id(m)) for k, m in jobs]]
    monkeypatch.setattr(planning, "replay_runs", None)  # each replayed aside, kept here
    for k, m in jobs:
        s = aside.place(k, m)
        assert (id(aside.compile(m)), tuple(s.device), tuple(s.order())) not in replayed_after
        assert aside.known(("place", k.name, id(m))), k.name
        mine, theirs = here.place(k, m), aside.place(k, m)
        assert (theirs.device, theirs.start, theirs.finish) == \
            (mine.device, mine.start, mine.finish), k.name
        monkeypatch.setattr(planning, "replay_runs", replays)
        expected = here.replay(here.compile(m), mine)
        monkeypatch.setattr(planning, "replay_runs", None)
        assert aside.replay(aside.compile(m), theirs) == expected, k.name
    monkeypatch.setattr(planning, "replay_runs", replays)
    tight = Planning(g, [Device(d.name, 1.0) for d in ds.devices], c)
    tight.place_aside([(KINDS["heft"], g)])()
    assert tight.known(("place", "heft", id(g)))
    with pytest.raises(DoesNotFit):
        tight.place(KINDS["heft"], g)


def test_tf_slim_s_layout_is_placed_aside_only_where_it_starts_from_the_replicas():
    """``replica_jobs``: TF-slim's layout and DPOS are placed on the replicas aside where the
    layout is the replicas themselves; where they fit no device (the layout is then fitted,
    or there is none) nothing is sent aside."""
    from fastt.sched.search.planning import Planning
    from fastt.sched.search.starts import replica_jobs
    from fastt.sched.sim.problem import Device
    from fastt.sched.registry import KINDS
    ds = parse("2xV100")
    g = training_graph(B=16)
    c = costs(ds, g)
    kinds = [KINDS[n] for n in names()]
    roomy = Planning(g, ds.devices, c)
    assert [(k.name, m) for k, m in replica_jobs(roomy, kinds)] == \
        [(n, roomy.replicas()) for n in ("data-parallel-ps", "dpos", "os-dpos")]
    assert replica_jobs(roomy, [KINDS["heft"], KINDS["data-parallel"]]) == []
    tight = Planning(g, [Device(d.name, 1.0) for d in ds.devices], c)
    assert replica_jobs(tight, kinds) == []
    one = Planning(g, ds.devices[:1], c)
    assert replica_jobs(one, kinds) == []


class _Profiled(StaticCosts):
    """Static costs whose steps pay ``own`` beyond their replay where the plan is ``key``,
    nothing elsewhere (a profiled plan's calibration, ``CostModels.step_overhead``)."""

    def __init__(self, seconds, device_set, key="", own=0.0):
        super().__init__(seconds, device_set)
        self.key, self.own = key, own

    def step_overhead(self, devices_used=None, plan=None):
        return self.own if plan is not None and plan == self.key else 0.0


def test_a_profiled_plan_is_judged_by_its_own_overhead_when_planned_again():
    ds = parse("2xV100")
    g = training_graph(B=16)
    times = costs(ds, g).seconds
    first = plan(g, ds.devices, _Profiled(times, ds), "os-dpos")
    assert len(set(first.placement.values())) == 2
    single = plan(g, ds.devices, _Profiled(times, ds), "single")
    # profiled, the plan took more than the gap to one device beyond its replay
    gap = single.predicted_step_time_s - first.predicted_step_time_s
    c = _Profiled(times, ds, first.key(), own=2 * gap)
    again = plan(g, ds.devices, c, "os-dpos")
    assert again.key() != first.key()
    assert again.predicted_step_time_s <= single.predicted_step_time_s + 1e-12
    # and a plan predicted as it was chosen: with its own overhead where it has one
    same = plan(g, ds.devices, _Profiled(times, ds, first.key(), own=0.1 * gap), "os-dpos")
    assert same.key() == first.key()
    assert same.predicted_step_time_s == pytest.approx(first.predicted_step_time_s + 0.1 * gap)
