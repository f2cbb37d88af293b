import pytest

from fastt import dtypes
from fastt.errors import GraphStructureError, UnknownDtypeError
from fastt.ir import Graph, Op, TensorRef, TensorSpec
from tests.helpers import chain, op


def test_tensor_bytes_from_dtype_and_shape():
    assert TensorSpec("float32", (2, 3)).nbytes == 24
    assert TensorSpec("float64", ()).nbytes == 8
    assert TensorSpec("float32", (None, 3)).nbytes is None
    assert TensorSpec("float32", None).nbytes is None
    assert TensorSpec("resource", ()).nbytes is None
    assert TensorSpec("int8_ref", (5,)).nbytes == 5


def test_unknown_dtype_is_named():
    with pytest.raises(UnknownDtypeError, match="'float31'"):
        TensorSpec("float31", (1,))
    with pytest.raises(UnknownDtypeError, match="999"):
        dtypes.name_from_enum(999, "op 'x'")
    assert dtypes.name_from_enum(101) == "float32_ref"


def test_edges_and_neighbours():
    g = Graph([op("a", "Const"), op("b", "Const"), op("c", "Add", ["a", "b"], control=["a"]),
               op("d", "Split", ["c"], out=((2,), (2,))), op("e", "Mul", ["d:1", "d:0"])])
    assert set(g.data_edges()) == {("a", 0, "c", 0), ("b", 0, "c", 1), ("c", 0, "d", 0),
                                   ("d", 1, "e", 0), ("d", 0, "e", 1)}
    assert g.control_edges() == [("a", "c")]
    assert g.successors("a") == {"c"} and g.predecessors("e") == {"d"}
    assert g.tensor(TensorRef("d", 1)).shape == (2,)
    order = g.topological_order()
    assert all(order.index(e.src) < order.index(e.dst) for e in g.data_edges())


def test_invalid_graphs_are_named():
    with pytest.raises(GraphStructureError, match="missing op 'zz'"):
        Graph([op("a", inputs=["zz"])])
    with pytest.raises(GraphStructureError, match="output 3"):
        Graph([op("a"), op("b", inputs=["a:3"])])
    with pytest.raises(GraphStructureError, match="duplicate"):
        Graph([op("a"), op("a")])
    with pytest.raises(GraphStructureError, match="cycle"):
        Graph([op("a", inputs=["b"]), op("b", inputs=["a"])]).topological_order()


def test_a_graph_derived_from_another_checks_what_could_have_broken(monkeypatch):
    """``like``: the ops of the base graph left as they were are not checked again, unless an
    op they could read is gone or has fewer outputs; every new or changed op is."""
    base = Graph([op("a", out=((4,), (4,))), op("b", inputs=["a:1"]), op("c", inputs=["b"])])
    ops = list(base)
    checked: list[str] = []
    real = Graph._validate

    def spy(self, todo):
        todo = list(todo)
        checked.extend(o.name for o in todo)
        real(self, todo)
    monkeypatch.setattr(Graph, "_validate", spy)
    Graph(ops + [op("d", inputs=["c"])], like=base)
    assert checked == ["d"]
    with pytest.raises(GraphStructureError, match="missing op 'zz'"):
        Graph(ops + [op("d", inputs=["zz"])], like=base)
    with pytest.raises(GraphStructureError, match="missing op 'a'"):
        Graph(ops[1:], like=base)  # b is base's own, but what it reads is gone
    with pytest.raises(GraphStructureError, match="output 1"):
        Graph([op("a")] + ops[1:], like=base)  # a has one output now
    checked.clear()
    Graph([op("a", out=((4,), (4,), (4,)))] + ops[1:], like=base)
    assert checked == ["a"]


def test_while_frame_is_detected_and_back_edge_ignored():
    g = Graph([
        op("x", "Const"),
        op("enter", "Enter", ["x"], attrs={"frame_name": "loop"}),
        op("merge", "Merge", ["enter", "next"], out=((4,), ())),
        op("cond", "LoopCond", ["merge"]),
        op("switch", "Switch", ["merge", "cond"], out=((4,), (4,))),
        op("body", "Relu", ["switch:1"]),
        op("next", "NextIteration", ["body"]),
        op("exit", "Exit", ["switch:0"]),
        op("after", "Relu", ["exit"]),
    ])
    assert len(g.topological_order()) == len(g)
    frames = g.while_frames()
    assert set(frames["loop"]) == {"enter", "merge", "cond", "switch", "body", "next"}
    assert g.loop_summary()["while_frames"] == {"loop": 6}


def test_colocation_groups_join_loc_attrs_and_resource_edges():
    g = Graph([op("v", "VarHandleOp", out=((),), dtype="resource", is_variable=True),
               op("read", "ReadVariableOp", ["v"]),
               op("init", "Const", colocate_with=("v",)),
               op("other", "Relu", ["read"])])
    groups = g.colocation_groups()
    assert groups["v"] == groups["read"] == groups["init"]
    assert groups["other"] == "other"


def test_dict_round_trip_and_shape_refinement():
    g = Graph([op("a", "Placeholder", out=((None, 3),)), op("b", "Relu", ["a"], out=((None, 3),))])
    g2 = Graph.from_dict(g.to_dict())
    assert g2.to_dict() == g.to_dict()
    refined = g.with_output_shapes({TensorRef("a", 0): (8, 3)}, {TensorRef("b", 0): 96})
    assert refined["a"].outputs[0].shape == (8, 3) and refined["a"].outputs[0].nbytes == 96
    assert refined["b"].outputs[0].nbytes == 96 and refined["b"].outputs[0].shape == (None, 3)
    assert g["a"].outputs[0].nbytes is None  # the original is untouched
    bad = g.to_dict()
    bad["ops"][0]["outputs"][0]["dtype"] = "float99"
    with pytest.raises(UnknownDtypeError, match="op 'a' output 0"):
        Graph.from_dict(bad)


def test_large_chain_is_fast_enough_to_build():
    g = chain(20000)
    assert len(g.topological_order()) == 20000


def test_topological_order_is_networkx_generations_flattened():
    # the order every compile numbers ops by: random DAGs with repeated inputs, control
    # edges that duplicate data edges, and a loop's back edge
    import random

    import networkx as nx
    rng = random.Random(7)
    for trial in range(30):
        n = rng.randint(2, 60)
        names = [f"n{i}" for i in rng.sample(range(n), n)]  # graph order is not topological
        rank = {name: i for i, name in enumerate(sorted(names, key=lambda s: int(s[1:])))}
        ops = []
        for name in names:
            earlier = [m for m in names if rank[m] < rank[name]]
            inputs = [rng.choice(earlier) for _ in range(rng.randint(0, 3))] if earlier else []
            control = rng.sample(earlier, min(len(earlier), rng.randint(0, 2)))
            ops.append(op(name, "NextIteration" if trial % 5 == 0 and rank[name] == 1
                          else "Op", inputs, control))
        g = Graph(ops)
        expected = [name for gen in nx.topological_generations(g.dag()) for name in gen]
        assert g.topological_order() == expected


def test_an_op_copied_with_changes_is_dataclasses_replace():
    import dataclasses
    o = op("a", "Conv2D", inputs=["x"], control=["y"], attrs={"k": 1}, device="/cpu:0")
    for f in dataclasses.fields(o):
        value = getattr(dataclasses.replace(o, name="other"), f.name)
        assert o.with_(**{f.name: value}) == dataclasses.replace(o, **{f.name: value})
    assert o.with_(inputs=(), name="b") == dataclasses.replace(o, inputs=(), name="b")
    assert o.with_() == o and o.with_() is not o
    with pytest.raises(TypeError, match="no field 'input'"):
        o.with_(input=())


def test_unread_ops_by_scan_and_by_the_edge_indexes_alike():
    """``unread``: of the names given (those in the graph), the ops no data or control
    edge leaves; the same whether the edge indexes are built or not."""
    f = (TensorSpec("float32", (2,)),)
    g = Graph([Op("a", "Const", outputs=f),
               Op("b", "Neg", inputs=(TensorRef("a", 0),), outputs=f), Op("c", "NoOp"),
               Op("d", "NoOp", control_inputs=("c",)), Op("e", "NoOp")])
    assert g.unread(["a", "b", "c", "d", "e", "missing"]) == {"b", "d", "e"}
    g.consumers("a"), g.control_successors("a")  # the indexes built
    assert g.unread(["a", "b", "c", "d", "e", "missing"]) == {"b", "d", "e"}
