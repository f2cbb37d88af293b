"""Weight transfers ordered by need (``fastt.sched.placers.transfer_order``): the pass, its replay
in the simulator, the planner's choice, and (in a process of its own) the ordered graphs
training like the original in-process and on a 2-worker cluster."""

import pytest

from fastt.costs.source import StaticCosts
from fastt.errors import FasttError
from fastt.ir import Graph, Op, TensorRef, TensorSpec
from fastt.sched.placers import transfer_order
from fastt.sched.sim.device_spec import DeviceSet
from fastt.sched.sim.problem import TRANSFER_STREAM, Device, Problem
from fastt.sched.sim.simulate import replay_placement
from fastt.sched.placers.transfer_order import order_transfers, prioritize, \
    weight_transfers
from tests.helpers import equivalence

DEVS = [Device("/cpu:0"), Device("/cpu:1")]
MB = 10 ** 6


def _var(name: str, nbytes: int) -> list[Op]:
    """A reference variable of ``nbytes`` and its read, as TF1 builds them."""
    n = nbytes // 4
    return [Op(name, "VariableV2", outputs=(TensorSpec("float32_ref", (n,)),),
               is_variable=True, stateful=True),
            Op(f"{name}/read", "Identity", inputs=(TensorRef(name, 0),),
               outputs=(TensorSpec("float32", (n,)),), colocate_with=(name,))]


def model() -> tuple[Graph, dict[str, str]]:
    """The big weight is made first (graph order), the small one is needed first: layer1
    reads the small weight, layer2 (after it) the big one; the weights live on device 0,
    the layers run on device 1."""
    ops = _var("big", 8 * MB) + _var("small", 400_000)
    ops += [Op("x", "Placeholder", outputs=(TensorSpec("float32", (1000,)),)),
            Op("layer1", "Mul", inputs=(TensorRef("x", 0), TensorRef("small/read", 0)),
               outputs=(TensorSpec("float32", (1000,)),)),
            Op("layer2", "Mul", inputs=(TensorRef("layer1", 0), TensorRef("big/read", 0)),
               outputs=(TensorSpec("float32", (1000,)),))]
    g = Graph(ops)
    placement = {n: DEVS[0].name if n.startswith(("big", "small")) else DEVS[1].name
                 for n in g.names}
    return g, placement


def costs() -> StaticCosts:
    links = {(a.name, b.name): (1e-4, 1e9) for a in DEVS for b in DEVS if a != b}
    return StaticCosts({"layer1": 5e-3, "layer2": 1e-3}, DeviceSet("CPU", DEVS, links))


@pytest.fixture
def every_weight_a_group(monkeypatch):
    monkeypatch.setattr(transfer_order, "GROUP_BYTES", 0)


def test_weights_crossing_a_link_are_found_with_when_they_are_needed():
    g, placement = model()
    found = {str(t.tensor): (t.src, t.dst, t.nbytes, t.need)
             for t in weight_transfers(g, placement, {"layer1": 1.0, "layer2": 7.0})}
    assert found == {"small/read:0": (DEVS[0].name, DEVS[1].name, 400_000, 1.0),
                     "big/read:0": (DEVS[0].name, DEVS[1].name, 8 * MB, 7.0)}


def test_a_tensor_computed_in_the_step_is_not_a_weight():
    g, placement = model()
    placement = {**placement, "layer1": DEVS[0].name}  # layer1's output crosses, not weights
    crossing = {str(t.tensor) for t in weight_transfers(g, placement, {})}
    assert crossing == {"big/read:0"}


def test_each_group_leaves_once_the_one_before_has_arrived(every_weight_a_group):
    g, placement = model()
    g2, placed, chains = order_transfers(g, placement, {"layer1": 1.0, "layer2": 7.0})
    assert [str(t.tensor) for t in chains[0]] == ["small/read:0", "big/read:0"]
    made = g2.names[len(g):]
    gates = [n for n in made if n.endswith("/gate")]
    copies = [n for n in made if n.endswith("/copy")]
    assert len(gates) == len(copies) == 2
    assert all(placed[n] == DEVS[0].name for n in gates)
    assert all(placed[n] == DEVS[1].name for n in copies)
    assert g2[gates[0]].control_inputs == () and g2[gates[1]].control_inputs == (copies[0],)
    assert g2["layer1"].inputs[1] == TensorRef(copies[0], 0)  # reads the small weight's copy
    assert g2["layer2"].inputs[1] == TensorRef(copies[1], 0)
    assert made == [gates[0], copies[0], gates[1], copies[1]]  # by when they open


def test_small_weights_travel_together():
    g, placement = model()  # 0.4 MB and 8 MB: one group of at least 1 MB, nothing to chain
    assert order_transfers(g, placement, {"layer1": 1.0, "layer2": 7.0})[2] == []


def test_a_plan_with_one_group_per_link_is_not_replayed(monkeypatch):
    """With groups of 10 MB, 0.4 MB and 8 MB make one group in any order: nothing to order,
    so neither the planned replay nor the ordered one is simulated."""
    monkeypatch.setattr(transfer_order, "GROUP_BYTES", 10 * MB)
    g, placement = model()
    p = Problem.from_graph(g, DEVS, costs())
    device = [0 if n.startswith(("big", "small")) else 1 for n in p.names]

    def no_replay(*args, **kwargs):
        raise AssertionError("replayed a plan with nothing to order")
    for name in ("replay_run", "replay_placement"):
        monkeypatch.setattr(transfer_order, name, no_replay)
    for ordered in (False, True):
        assert prioritize(g, p, device, list(range(p.n)), ordered,
                          lambda x: Problem.from_graph(x, DEVS, costs()), (1.0, 1.0)) is None
    monkeypatch.setattr(transfer_order, "GROUP_BYTES", 0)  # each weight a group: replayed
    with pytest.raises(AssertionError, match="nothing to order"):
        prioritize(g, p, device, list(range(p.n)), False,
                   lambda x: Problem.from_graph(x, DEVS, costs()), (1.0, 1.0))


def test_the_simulator_sees_the_gain_of_sending_the_needed_weight_first(every_weight_a_group):
    """TensorFlow's first-come order sends the big weight first (it is read first): layer1
    waits 8.1 ms for the small one behind it. Ordered, the small one arrives in 0.5 ms and
    layer1 computes while the big one moves."""
    g, placement = model()
    p = Problem.from_graph(g, DEVS, costs())
    device = [DEVS.index(next(d for d in DEVS if d.name == placement[n])) for n in p.names]
    without = replay_placement(p, device, None)
    assert without[1] == pytest.approx(8.1e-3 + 0.5e-3 + 5e-3 + 1e-3, rel=1e-6)
    got = prioritize(g, p, device, list(range(p.n)), False,
                     lambda x: Problem.from_graph(x, DEVS, costs()), without)
    assert got is not None and got.kept and got.without == without
    # small 0.5 ms, the control message back 0.1 ms, big 8.1 ms: layer2 at 8.7 ms
    assert got.times[1] == pytest.approx(0.5e-3 + 1e-4 + 8.1e-3 + 1e-3, rel=1e-6)
    assert got.summary()["transfers"] == 2
    p2 = Problem.from_graph(got.graph, DEVS, costs())
    assert {p2.stream[i] for i, n in enumerate(p2.names) if n.startswith("fastt")} == \
        {TRANSFER_STREAM}
    ordered = prioritize(g, p, device, list(range(p.n)), True,
                         lambda x: Problem.from_graph(x, DEVS, costs()), without)
    assert ordered is not None and ordered.times[1] == pytest.approx(got.times[1])


def test_auto_keeps_the_order_only_where_it_is_predicted_faster(every_weight_a_group):
    g, placement = model()
    g = Graph([op.with_(inputs=(op.inputs[0], TensorRef("big/read", 0)))
               if op.name == "layer1" else
               op.with_(inputs=(op.inputs[0], TensorRef("small/read", 0)))
               if op.name == "layer2" else op for op in g])  # the big one is needed first
    p = Problem.from_graph(g, DEVS, costs())
    device = [0 if n.startswith(("big", "small")) else 1 for n in p.names]
    without = replay_placement(p, device, None)
    again = prioritize(g, p, device, list(range(p.n)), False,
                       lambda x: Problem.from_graph(x, DEVS, costs()), without)
    assert again is not None and not again.kept and again.graph is g  # the gates only cost
    forced = prioritize(g, p, device, list(range(p.n)), False,
                        lambda x: Problem.from_graph(x, DEVS, costs()), without, mode="on")
    assert forced is not None and forced.kept and forced.times[1] >= without[1]


def test_off_and_bad_modes():
    g, placement = model()
    p = Problem.from_graph(g, DEVS, costs())
    args = (g, p, [0] * p.n, list(range(p.n)), False, lambda x: p, (0.0, 0.0))
    assert prioritize(*args, mode="off") is None
    with pytest.raises(FasttError, match="transfer priorities must be one of"):
        prioritize(*args, mode="always")


def test_ordered_weight_transfers_train_like_the_original():
    """The parameter-server layout with every weight chained, in-process (TensorFlow's order
    and the priority executor) and over two gRPC workers (control dependencies), in a
    process of its own (``tests/equivalence.py --priorities``)."""
    assert equivalence("--priorities").count("ordered weight transfers train as the original") == 3


def _layers(k: int = 6) -> tuple[Graph, dict[str, str]]:
    """k weights on device 0 read by a chain of layers on device 1 (one layer reads its
    weight twice, one reads two weights), the last layer on device 0; a NoOp waits for
    every layer (a ``tf.group``)."""
    ops = [op for i in range(k) for op in _var(f"w{i}", (i + 1) * 100_000)]
    ops.append(Op("x", "Placeholder", outputs=(TensorSpec("float32", (1000,)),)))
    prev = "x"
    for i in range(k):
        reads = [TensorRef(f"w{i}/read", 0)] * (2 if i == 1 else 1) + \
            [TensorRef(f"w{i - 1}/read", 0)] * (i == 3)
        ops.append(Op(f"layer{i}", "Mul", inputs=(TensorRef(prev, 0), *reads),
                      control_inputs=("x",) * (i == 2), outputs=(TensorSpec("float32", (1000,)),)))
        prev = f"layer{i}"
    ops.append(Op("group_deps", "NoOp", control_inputs=tuple(f"layer{i}" for i in range(k))))
    g = Graph(ops)
    placement = {n: DEVS[0].name if n.startswith("w") or n == f"layer{k - 1}" else DEVS[1].name
                 for n in g.names}
    return g, placement


def _by_name(p: Problem) -> dict[str, tuple]:
    """``p`` with its ops and edges named rather than numbered."""
    return {n: (tuple(p.w[i]), p.mem[i], p.persistent[i], p.stream[i], p.names[p.group[i]],
                sorted((p.names[a], sorted(map(str, dict(p.edge_tensors[e]))), p.edge_bytes[e])
                       for a, e in p.preds[i]),
                sorted(p.names[b] for b, _ in p.succs[i]))
            for i, n in enumerate(p.names)}


def test_the_extended_problem_is_the_one_compiled_from_scratch(every_weight_a_group):
    """The ordered graph's problem, derived from the plan's (``fastt.sched.sim.extend``), has the
    ops, costs, memory, groups, streams and edges of the ordered graph compiled anew, a valid
    topological order, and replays the same."""
    from fastt.sched.sim.extend import extended
    g, placement = _layers()
    p = Problem.from_graph(g, DEVS, costs())
    need = {n: float(i) for i, n in enumerate(p.names)}
    g2, placed, chains = order_transfers(g, placement, need)
    assert chains and len(g2) > len(g)
    compiled: list[Graph] = []

    def compile_graph(x: Graph) -> Problem:
        compiled.append(x)
        return Problem.from_graph(x, DEVS, costs())
    got, fresh = extended(p, g, g2, compile_graph), Problem.from_graph(g2, DEVS, costs())
    assert compiled and all(len(x) < len(g2) for x in compiled)  # only the gates' graph
    assert _by_name(got) == _by_name(fresh)
    assert got.names[:p.n] == p.names and sorted(got.topo) == list(range(got.n))
    at = {i: k for k, i in enumerate(got.topo)}
    assert all(at[a] < at[j] for j in range(got.n) for a, _ in got.preds[j])
    replays = []
    for q in (got, fresh):
        device = [DEVS.index(next(d for d in DEVS if d.name == placed[n])) for n in q.names]
        order = [q.index[n] for n in g2.topological_order()]
        replays.append(replay_placement(q, device, None) + replay_placement(q, device, order))
    assert replays[0] == pytest.approx(replays[1], rel=1e-12)


def test_an_update_rewired_keeps_its_variable_and_is_extended(every_weight_a_group):
    """An update op on device 1 reads its own variable's reference (an edge that colocates
    them) and a weight sent from device 0: ordering rewires the weight's edge only, so the
    problem is extended (not compiled anew) and equals the fresh compile."""
    from fastt.sched.sim.extend import extendable, extended
    g, placement = _layers()
    ops = list(g) + _var("u", 4000) + [Op(
        "u/apply", "ApplyGradientDescent", inputs=(TensorRef("u", 0), TensorRef("x", 0),
                                                   TensorRef("w2/read", 0)),
        outputs=(TensorSpec("float32_ref", (1000,)),), colocate_with=("u",), stateful=True)]
    g = Graph(ops)
    placement.update({n: DEVS[1].name for n in ("u", "u/read", "u/apply")})
    p = Problem.from_graph(g, DEVS, costs())
    g2, _, chains = order_transfers(g, placement, {n: float(i) for i, n in enumerate(p.names)})
    found = extendable(g, g2)
    assert found is not None and "u/apply" in found[1]
    got = extended(p, g, g2, lambda x: Problem.from_graph(x, DEVS, costs()))
    fresh = Problem.from_graph(g2, DEVS, costs())
    assert _by_name(got) == _by_name(fresh)
    assert got.names[got.group[got.index["u/apply"]]] == "u"


def test_a_graph_that_changes_more_than_inputs_is_compiled_anew(every_weight_a_group):
    from fastt.sched.sim.extend import extended
    g, placement = _layers()
    p = Problem.from_graph(g, DEVS, costs())
    g2 = order_transfers(g, placement, {n: float(i) for i, n in enumerate(p.names)})[0]
    cases = {
        "an op gone": Graph([op for op in g2 if op.name != "group_deps"]),
        "an op's type changed": g2.replace_ops({"layer0": g2["layer0"].with_(type="Add")}),
        "an added op colocated": g2.replace_ops({
            n: g2[n].with_(colocate_with=("w0",)) for n in g2.names if n.endswith("/gate")}),
    }
    for why, new in cases.items():
        compiled: list[Graph] = []
        got = extended(p, g, new, lambda x: compiled.append(x) or Problem.from_graph(
            x, DEVS, costs()))
        assert compiled == [new], why
        assert got.n == len(new), why
    assert extended(p, g, g, lambda x: pytest.fail("compiled")) is p


def test_under_a_deadline_a_plan_that_cannot_win_keeps_its_transfers_unordered(
        every_weight_a_group, monkeypatch):
    """Ordering a plan's weight transfers adds gates: it cannot end faster than the plan
    with free links (9.1 ms here; 14.6 ms with one transfer at a time). Under a deadline
    the ordering is not begun once a plan of 9.1 ms or less is known; without a deadline,
    or while none is, it is (and here kept: 9.7 ms)."""
    from fastt.sched.search import planning
    from fastt.sched.search.osdpos import Plan, clock
    from fastt.sched.sim.schedule import Schedule
    from fastt.sched.strategy import _finish
    calls = []
    real = planning.prioritize
    monkeypatch.setattr(planning, "prioritize",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    g, placement = model()
    for deadline, best_s, begun in ((None, 1e-3, True), (600.0, None, True),
                                    (600.0, 9.2e-3, True), (600.0, 9.1e-3, False)):
        calls.clear()
        shared = planning.Planning(g, DEVS, costs(),
                                   deadline=None if deadline is None else clock() + deadline)
        p = shared.compile(g)
        device = [DEVS.index(next(d for d in DEVS if d.name == placement[n])) for n in p.names]
        s = Schedule(device, [float(i) for i in range(p.n)], [i + 1.0 for i in range(p.n)])
        assert shared.replay(p, s) == pytest.approx((9.1e-3, 14.6e-3), rel=1e-6)
        if best_s is not None:
            shared.best_s = best_s  # another plan replayed that fast
        fin = _finish(shared, Plan(g, p, s), choose_order=False)
        assert bool(calls) == begun, (deadline, best_s)
        assert fin.times[1] == pytest.approx(9.7e-3 if begun else 14.6e-3, rel=1e-6)
