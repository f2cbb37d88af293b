"""Reads of a variable that came before its update in the user's graph still do after every
rewrite fastt makes (``fastt.passes.update_order``)."""
import pytest

from fastt.ir import Graph, OpMeta
from fastt.passes.update_order import (lost_update_orders, reads_before_updates, variable_reads,
                                      variable_updates)
from tests.helpers import op


def _step(penalty_first=True):
    """w (a reference variable) read through w/read by the forward pass and an L2 penalty;
    the penalty (the loss) reaches the update only through the gate (``penalty_first``)."""
    return Graph([
        op("x", "Placeholder", out=((4, 2),)),
        op("w", "VariableV2", out=((2, 2),), dtype="float32_ref", is_variable=True),
        op("w/read", "Identity", ["w"], out=((2, 2),)),
        op("w/alias", "Reshape", ["w/read"], out=((4,),)),
        op("h", "MatMul", ["x", "w/read"], out=((4, 2),)),
        op("penalty", "L2Loss", ["w/alias"], out=((),)),
        op("loss", "Identity", ["penalty"], out=((),)),  # fetched
        op("gate", "NoOp", control=("loss",) if penalty_first else ()),
        op("dw", "MatMul", ["x", "h"], out=((2, 2),), attrs={"transpose_a": True}),
        op("lr", "Const", out=((),)),
        op("update", "ApplyGradientDescent", ["w", "lr", "dw"], control=("gate",),
           out=((2, 2),), dtype="float32_ref", stateful=True),
    ])


def test_the_consumers_of_a_reference_variables_alias_are_its_reads():
    g = _step()
    reads = variable_reads(g)
    assert {n for n, v in reads.items() if "w" in v} == {"h", "penalty"}
    assert variable_updates(g) == {"update": "w"}


def test_a_rewrite_that_drops_the_path_from_a_read_to_the_update_is_named():
    original = _step()
    assert lost_update_orders(original, original) == []
    assert lost_update_orders(original, _step(penalty_first=False)) == [("penalty", "update")]
    # the forward's parts stand for h: they read w's buffer, and still come first
    parts = Graph([o for o in original if o.name != "h"] + [
        op(f"h/part{k}", "MatMul", ["x", "w/read"], out=((2, 2),)) for k in range(2)] + [
        op("h", "ConcatV2", ["h/part0", "h/part1"], out=((4, 2),))])
    parts = parts.replace_ops({f"h/part{k}": parts[f"h/part{k}"].with_(
        meta=OpMeta(origin="h", replica=k)) for k in range(2)})
    assert lost_update_orders(original, parts) == []
    cut = parts.replace_ops({"dw": parts["dw"].with_(inputs=(parts["dw"].inputs[0],
                                                              parts["h/part0"].inputs[0]))})
    assert lost_update_orders(original, cut) == [("h/part0", "update"), ("h/part1", "update")]


tf = pytest.importorskip("tensorflow")
from fastt.passes.allreduce import all_reduce  # noqa: E402
from fastt.passes.data_parallel import data_parallel  # noqa: E402
from fastt.passes.splitting import apply_splits  # noqa: E402
from tests.equivalence import build, forced_splits  # noqa: E402


@pytest.mark.parametrize("name", ["small_cnn_ref", "lenet_ref"])
def test_every_rewrite_keeps_the_reads_of_reference_variables_before_their_updates(name):
    m, ir = build(name)
    step = ir.fan_in([m.train_op.name])
    assert reads_before_updates(step)  # the forward's reads, each before its update
    for n in (2, 4):
        assert lost_update_orders(step, data_parallel(step, n)) == []
        assert lost_update_orders(step, all_reduce(step, n)) == []
    for s in forced_splits(ir, m, 2):
        assert lost_update_orders(step, apply_splits(step, [s])) == [], s
