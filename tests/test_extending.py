"""The recipes of docs/extending.md, checked: a placer added with one registry entry (and its
own code, here in this file) is planned by name, accepted by ``FASTT_STRATEGY`` and the
dump schema, listed by the CLI, and becomes an OS-DPOS starting point only when it opts in;
a split rule is one entry of the table keyed by op type; a cost source overrides only what
it knows. No TensorFlow."""
import pytest

from fastt.costs.source import StaticCosts
from fastt.sched import registry
from fastt.sched.placers.baselines import timed
from fastt.sched.sim.device_spec import parse
from fastt.sched.sim.problem import Problem
from fastt.sched.registry import StrategyKind
from fastt.sched.sim.schedule import Schedule
from fastt.sched.strategy import plan
from tests.helpers import training_graph

CALLS: list[str] = []


def round_robin(p: Problem) -> Schedule:
    """The toy placer: ops in topological order, dealt to the devices in turn (groups of ops
    TensorFlow keeps together on the device of their first)."""
    CALLS.append("round-robin")
    device, first = [-1] * p.n, {}
    for k, i in enumerate(p.topo):
        device[i] = first.setdefault(p.group[i], k % p.num_devices)
    return timed(p, device, p.topo)


@pytest.fixture
def toy(monkeypatch):
    """The one registry entry a new placer needs (undone after the test)."""
    monkeypatch.setitem(registry.KINDS, "round-robin", None)  # removed after the test

    def add(starts_search):
        registry.register(StrategyKind("round-robin", lambda p, _: round_robin(p), "model",
                                       False, "ops dealt to the devices in turn",
                                       starts_search=starts_search))
        CALLS.clear()
    return add


def _costs(ds, g):
    return StaticCosts({o.name: 1e-3 * (5 if o.type == "MatMul" else 1) for o in g}, ds)


def test_a_registered_placer_is_planned_checked_and_listed_everywhere(toy, capsys):
    toy(starts_search=False)
    ds, g = parse("2xV100"), training_graph(B=8)
    s = plan(g, ds.devices, _costs(ds, g), "round-robin")
    assert CALLS == ["round-robin"] and s.name == "round-robin"
    assert set(s.placement.values()) == set(s.devices)  # dealt over both devices
    from fastt.plugin.settings import from_env
    assert from_env({"FASTT_STRATEGY": "Round-Robin"}).strategy == "round-robin"
    from fastt.inspect.schema import schema
    assert "round-robin" in schema("strategy")["$defs"]["strategy_name"]["enum"]
    from fastt.cli import build_parser
    build_parser().parse_args(["plan", "--model", "mlp", "--devices", "2xV100", "--strategy",
                               "round-robin"])  # a choice of the CLI
    assert "round-robin" in registry.table()


def test_a_placer_starts_os_dpos_only_when_it_opts_in(toy):
    ds, g = parse("2xV100"), training_graph(B=8)
    toy(starts_search=False)
    plan(g, ds.devices, _costs(ds, g), "os-dpos")
    assert CALLS == []
    toy(starts_search=True)
    plan(g, ds.devices, _costs(ds, g), "os-dpos")
    assert CALLS == ["round-robin"]


def test_the_strategies_table_in_the_docs_is_the_registrys():
    import os
    docs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                        "strategies.md")
    assert registry.table() in open(docs, encoding="utf-8").read(), \
        "docs/strategies.md: paste the output of python -m fastt.sched.registry"


def test_a_split_rule_is_one_entry_of_the_table(monkeypatch):
    from fastt.ir import Graph
    from fastt.passes import split_rules
    from fastt.passes.split_rules import FULL, SPLIT, Part, SplitRule, find, rules
    from fastt.passes.splitting import Split, apply_splits
    from tests.helpers import op
    g = Graph([op("x", "Placeholder", out=((8, 4),)),
               op("y", "RowWise", ["x"], out=((8, 4),)),
               op("z", "Identity", ["y"], out=((8, 4),))])
    assert rules(g["y"], g) == []
    by_rows = SplitRule("batch", (Part(SPLIT, 0),), "concat", 0)
    monkeypatch.setitem(split_rules.RULES, "RowWise", lambda o, graph: [by_rows])
    assert find(g["y"], g, "batch") == by_rows and Part(FULL) not in by_rows.inputs
    cut = apply_splits(g, [Split("y", "batch", 2)])
    assert {"y/part0", "y/part1"} <= set(cut.names)


def test_a_cost_source_overrides_only_what_it_knows():
    from fastt.costs.source import CostSource, knows_step_overhead
    from fastt.sched.sim.problem import Problem
    ds, g = parse("2xV100"), training_graph(B=8)

    class Flat(CostSource):  # the two required methods
        def compute(self, op, device):
            return 1e-3

        def link(self, src, dst):
            return ds.link(src, dst)

    class Remote(Flat):  # and one optional
        def device_step(self, device):
            return 2e-3
    flat, remote = (Problem.from_graph(g, ds.devices, c()) for c in (Flat, Remote))
    assert flat.reach == [0.0, 0.0] and remote.reach == [2e-3, 2e-3]
    assert flat.w == remote.w and not knows_step_overhead(Flat())
    assert plan(g, ds.devices, Flat(), "dpos").predicted_step_time_s > 0
