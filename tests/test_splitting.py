import pytest

from fastt.errors import FasttError
from fastt.ir import Graph
from fastt.passes.split_rules import part_sizes, rules
from fastt.passes.splitting import Split, apply_splits, split_operation
from tests.helpers import op


def conv_net():
    """x -> conv -> relu -> loss, plus conv's two backprops fed by a gradient."""
    return Graph([
        op("x", "Placeholder", out=((8, 6, 6, 3),)),
        op("w", "Const", out=((3, 3, 3, 4),)),
        op("conv", "Conv2D", ["x", "w"], out=((8, 6, 6, 4),)),
        op("relu", "Relu", ["conv"], out=((8, 6, 6, 4),)),
        op("loss", "Sum", ["relu"], out=((),)),
        op("g", "Placeholder", out=((8, 6, 6, 4),)),
        op("sizes", "ShapeN", ["x", "w"], out=((4,), (4,)), dtype="int32"),
        op("dx", "Conv2DBackpropInput", ["sizes:0", "w", "g"], out=((8, 6, 6, 3),)),
        op("dw", "Conv2DBackpropFilter", ["x", "sizes:1", "g"], out=((3, 3, 3, 4),)),
    ])


def test_rules_per_type():
    g = conv_net()
    assert {r.dim for r in rules(g["conv"], g)} == {"batch", "channel"}
    assert {r.dim for r in rules(g["dw"], g)} == {"batch", "channel"}
    assert [r.join for r in rules(g["dw"], g)] == ["sum", "concat"]
    assert [r.dim for r in rules(g["relu"], g)] == ["batch"]
    assert rules(g["loss"], g) == []  # a reduction: not in the rule table
    bn = op("bn", "FusedBatchNormV3", ["x"], out=((8, 6, 6, 3),))
    assert rules(bn, Graph([g["x"], bn])) == []  # batch statistics are never batch-split
    assert part_sizes(10, 4) == [3, 3, 2, 2]


def test_batch_split_of_conv_keeps_the_name_and_shapes():
    g = split_operation(conv_net(), "conv", "batch", 3)
    assert g["conv"].type == "ConcatV2" and g["conv"].outputs == conv_net()["conv"].outputs
    parts = [g[f"conv/part{k}"] for k in range(3)]
    assert [p.outputs[0].shape for p in parts] == [(3, 6, 6, 4), (3, 6, 6, 4), (2, 6, 6, 4)]
    assert [p.meta.fraction for p in parts] == pytest.approx([3 / 8, 3 / 8, 2 / 8])
    assert all(p.inputs[1].op == "w" for p in parts)  # the filter is passed whole
    assert g["conv/split_in0"].attrs["size_splits"] == [3, 3, 2]
    assert g["relu"].inputs[0].op == "conv"  # consumers read the join


def test_split_propagates_between_ops_cut_alike():
    g = apply_splits(conv_net(), [Split("conv", "batch", 2), Split("relu", "batch", 2)])
    assert g["relu/part0"].inputs[0].op == "conv/part0"
    assert g["relu/part1"].inputs[0].op == "conv/part1"
    assert "relu/split_in0" not in g
    assert "conv" not in g  # its join had no consumer left


def test_weight_gradient_batch_split_is_summed_and_shape_inputs_shrink():
    g = split_operation(conv_net(), "dw", "batch", 2)
    assert g["dw"].type == "AddN" and g["dw"].outputs[0].shape == (3, 3, 3, 4)
    assert g["dw/part0"].outputs[0].shape == (3, 3, 3, 4)
    g = split_operation(conv_net(), "dx", "batch", 2)
    assert g["dx/shape_in0_1"].attrs["value"] == [4, 6, 6, 3]
    assert g["dx/part1"].inputs[0].op == "dx/shape_in0_1"


def test_channel_split_of_conv_cuts_the_filter():
    g = split_operation(conv_net(), "conv", "channel", 2)
    assert g["conv/split_in1"].attrs == {"axis": 3, "size_splits": [2, 2], "shares": [2, 2]}
    assert g["conv/split_in1"].meta.split_of == "conv"
    assert g["conv"].attrs["axis"] == 3


def test_refusals_are_clear():
    with pytest.raises(FasttError, match="cannot be split on 'rows'"):
        split_operation(conv_net(), "conv", "rows", 2)
    with pytest.raises(FasttError, match="cannot be cut into 9 parts"):
        split_operation(conv_net(), "conv", "batch", 9)


def test_a_reshape_fastt_made_with_its_shape_as_an_attribute_has_no_split_rule():
    """The all-reduce unfuses a bucket with one-input Reshapes (the shape an attribute):
    OS-DPOS must not try to cut them as a user's [B, ...] Reshape (it crashed)."""
    g = Graph([op("flat", "Placeholder", out=((48,),)),
               op("w", "Reshape", ["flat"], out=((8, 6),), attrs={"shape": [8, 6]})])
    assert rules(g["w"], g) == []


def test_gelu_and_a_batched_gather_split_on_the_batch():
    B, S, P, D = 8, 16, 3, 4
    g = Graph([
        op("x", "Placeholder", out=((B, S, D),)),
        op("positions", "Placeholder", out=((B, P),), dtype="int32"),
        op("axis", "Const", out=((),), dtype="int32", attrs={"value": 1}),
        op("picked", "GatherV2", ["x", "positions", "axis"], out=((B, P, D),),
           attrs={"batch_dims": 1}),
        op("erfc", "Erfc", ["picked"], out=((B, P, D),)),
        op("zero", "Const", out=((),), dtype="int32", attrs={"value": 0}),
        op("rows", "GatherV2", ["x", "positions", "zero"], out=((B, P, S, D),),
           attrs={"batch_dims": 1}),  # axis below batch_dims: not a per-example pick
    ])
    picked = [r for r in rules(g["picked"], g) if r.dim == "batch"]
    assert picked and [p.kind for p in picked[0].inputs][:2] == ["split", "split"]
    assert any(r.dim == "batch" for r in rules(g["erfc"], g))
    assert not rules(g["rows"], g)
