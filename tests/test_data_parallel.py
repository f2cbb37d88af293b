import pytest

from fastt.errors import FasttError
from fastt.ir import Graph
from fastt.passes.data_parallel import BATCH_SHAPE, batch_size, data_parallel, \
    fold_static_shapes
from fastt.passes.replicas import replica_of
from fastt.passes.split_rules import rules
from fastt.passes.update_order import lost_update_orders, reads_before_updates
from tests.helpers import op, training_graph


def test_replicas_chain_and_gradients_are_summed_before_one_update():
    g = data_parallel(training_graph(), 2)
    # The forward matmul and relu are replicated and chained part to part.
    assert g["a/part1"].inputs[0].op == "h/part1"
    assert {replica_of(g[f"h/part{k}"]) for k in range(2)} == {0, 1}
    # Batch norm statistics run once, on the whole batch (behind a concat of the replicas).
    assert g["bn"].type == "FusedBatchNormV3" and g["bn"].inputs[0].op == "a"
    assert g["a"].type == "ConcatV2"
    # The weight gradient is cut on its reduced (batch) dimension and summed: one update.
    assert g["dw"].type == "AddN" and [r.op for r in g["dw"].inputs] == ["dw/part0", "dw/part1"]
    assert g["dw/part0"].attrs["transpose_a"] is True
    assert g["update"].inputs[2].op == "dw" and "update/part0" not in g
    # The shape of a tensor that carries the batch is read at run time from the batch input
    # (any batch size runs), not materialised from the replicas.
    assert g["shape"].type == BATCH_SHAPE and g["shape"].attrs["value"] == [8, 4]
    assert (g["shape"].attrs["axis"], g["shape"].attrs["multiple"]) == (0, 1)
    assert g[g["shape"].inputs[0].op].type == "Shape" and \
        g[g["shape"].inputs[0].op].inputs[0].op == "x"
    # Shares: 4 and 4 rows; x is cut once and both of its consumers share the cut.
    assert g["h/split_in0"].attrs["size_splits"] == [4, 4]
    assert g["h/part0"].outputs[0].shape == (4, 3)
    assert g["dw/part1"].inputs[0] == g["h/part1"].inputs[0]
    assert sum(o.type == "SplitV" for o in g) == 2  # x, and the whole-batch BN output


def weight_used_twice(B=8):
    """w at two time steps: dW = dw1 + dw2 (through the Identity tf.gradients puts behind
    one of them), then one update."""
    return Graph([
        op("x", "Placeholder", out=((B, 4),)),
        op("w", "VarHandleOp", out=((),), dtype="resource", is_variable=True),
        op("w/read", "ReadVariableOp", ["w"], out=((4, 4),)),
        op("h1", "MatMul", ["x", "w/read"], out=((B, 4),)),
        op("h2", "MatMul", ["h1", "w/read"], out=((B, 4),)),
        op("dh2", "Relu", ["h2"], out=((B, 4),)),
        op("dw2", "MatMul", ["h1", "dh2"], out=((4, 4),), attrs={"transpose_a": True}),
        op("dw1", "MatMul", ["x", "dh2"], out=((4, 4),), attrs={"transpose_a": True}),
        op("dw1/id", "Identity", ["dw1"], out=((4, 4),)),
        op("dw", "AddN", ["dw1/id", "dw2"], out=((4, 4),)),
        op("lr", "Const", out=((),)),
        op("update", "ResourceApplyGradientDescent", ["w", "lr", "dw"], out=()),
    ])


def test_a_weight_used_twice_has_its_gradients_summed_within_each_replica():
    # Summed replica by replica, as towers do: one partial gradient leaves each replica.
    dp = data_parallel(weight_used_twice(), 2)
    for k in range(2):
        assert [r.op for r in dp[f"dw/part{k}"].inputs] == [f"dw1/id/part{k}", f"dw2/part{k}"]
        assert dp[f"dw1/id/part{k}"].inputs[0].op == f"dw1/part{k}"
        assert replica_of(dp[f"dw/part{k}"]) == k
    assert [r.op for r in dp["dw"].inputs] == ["dw/part0", "dw/part1"]  # the one join
    assert "dw1" not in dp and "dw2" not in dp and "dw1/id" not in dp  # no joins in between
    assert dp["dw/part1"].meta.fraction == 1.0  # each part sums whole tensors
    assert dp["update"].inputs[2].op == "dw"


def test_uneven_batches_get_near_equal_shares():
    g = data_parallel(training_graph(B=7), 3)
    assert [g[f"h/part{k}"].outputs[0].shape[0] for k in range(3)] == [3, 2, 2]
    assert sum(g[f"h/part{k}"].meta.fraction for k in range(3)) == pytest.approx(1)


def test_batch_detection_and_refusals():
    assert batch_size(training_graph(B=16)) == 16
    with pytest.raises(FasttError, match="cannot be shared by 9"):
        data_parallel(training_graph(B=8), 9)
    with pytest.raises(FasttError, match="cannot find the batch"):
        batch_size(Graph([op("c", "Const")]))
    assert data_parallel(training_graph(), 1)["h"].type == "MatMul"


def test_shape_n_folds_into_constants_behind_identity_n():
    g = Graph([op("x", "Placeholder", out=((2, 3),)), op("y", "Placeholder", out=((5,),)),
               op("s", "ShapeN", ["x", "y"], out=((2,), (1,)), dtype="int32"),
               op("use", "Identity", ["s:1"], out=((1,),), dtype="int32")])
    f = fold_static_shapes(g)
    assert f["s"].type == "IdentityN" and f["s/folded1"].attrs["value"] == [5]
    assert f["use"].inputs[0].op == "s" and f["use"].inputs[0].index == 1


def test_shapes_downstream_of_a_data_sized_op_are_never_folded():
    """A sparse gradient's ``Unique`` indices: one step measured 17 of them, the next may
    have any number; the Shape that sizes the segment sum must be read at run time."""
    g = Graph([op("ids", "Placeholder", out=((32,),), dtype="int32"),
               op("u", "Unique", ["ids"], out=((17,), (32,)), dtype="int32"),
               op("n", "Shape", ["u"], out=((1,),), dtype="int32"),
               op("x", "Placeholder", out=((2, 3),)),
               op("m", "Shape", ["x"], out=((2,),), dtype="int32")])
    f = fold_static_shapes(g)
    assert f["n"].type == "Shape" and f["m"].type == "Const"


def test_a_folded_shape_keeps_a_penalty_on_a_reference_variable_before_its_update():
    # tf.gradients seeds the backward pass with Fill(Shape(loss), 1): that is all that makes
    # the L2 penalty, reading w's buffer through w/read (an alias of it), run before the
    # update that overwrites the buffer in place. Folded, the Shape keeps it, as grappler does.
    B = 8
    g = Graph([
        op("x", "Placeholder", out=((B, 4),)),
        op("w", "VariableV2", out=((4, 3),), dtype="float32_ref", is_variable=True),
        op("w/read", "Identity", ["w"], out=((4, 3),)),
        op("h", "MatMul", ["x", "w/read"], out=((B, 3),)),
        op("axes", "Const", out=((2,),), dtype="int32", attrs={"value": [0, 1]}),
        op("data_loss", "Mean", ["h", "axes"], out=((),)),
        op("penalty", "L2Loss", ["w/read"], out=((),)),
        op("loss", "AddN", ["data_loss", "penalty"], out=((),)),
        op("loss_shape", "Shape", ["loss"], out=((0,),), dtype="int32"),
        op("one", "Const", out=((),)),
        op("seed", "Fill", ["loss_shape", "one"], out=((),)),
        op("dh", "Mul", ["seed", "h"], out=((B, 3),)),
        op("dw_data", "MatMul", ["x", "dh"], out=((4, 3),), attrs={"transpose_a": True}),
        op("dw_penalty", "Mul", ["seed", "w/read"], out=((4, 3),)),
        op("dw", "AddN", ["dw_data", "dw_penalty"], out=((4, 3),)),
        op("lr", "Const", out=((),)),
        op("update", "ApplyGradientDescent", ["w", "lr", "dw"], out=((4, 3),),
           dtype="float32_ref", stateful=True),
    ])
    assert ("penalty", "update") in reads_before_updates(g)
    dp = data_parallel(g, 2)
    assert dp["loss_shape"].type == "Const" and lost_update_orders(g, dp) == []
    assert lost_update_orders(g, fold_static_shapes(g)) == []


def test_a_join_is_not_priced_as_the_op_whose_name_it_carries():
    # The DP graph's join "dw" (an AddN of the replicas' partial sums) and the model graph's
    # own AddN "dw": one search compiles both, and each keeps its own cost.
    from fastt.costs.source import StaticCosts
    from fastt.sched.sim.device_spec import parse
    from fastt.sched.search.osdpos import compiler
    g = weight_used_twice()
    ds = parse("2xV100")
    compile_graph = compiler(ds.devices, StaticCosts({"dw": 1e-3}, ds), g)
    dp = compile_graph(data_parallel(g, 2))
    model = compile_graph(g)
    assert dp.w[dp.index["dw"]][0] < 1e-6  # a copy of 48 bytes
    assert model.w[model.index["dw"]][0] == 1e-3


def test_a_random_op_runs_once_on_the_whole_batch():
    """A dropout mask drawn for the batch is drawn once, as in the original, and cut for the
    replicas: drawing a part per replica would change its values."""
    B = 8
    g = Graph([
        op("x", "Placeholder", out=((B, 4),)),
        op("shape", "Shape", ["x"], out=((2,),), dtype="int32"),
        op("mask", "RandomUniform", ["shape"], out=((B, 4),), attrs={"seed": 1, "seed2": 2}),
        op("drop", "Mul", ["x", "mask"], out=((B, 4),)),
        op("w", "VarHandleOp", out=((),), dtype="resource", is_variable=True),
        op("w/read", "ReadVariableOp", ["w"], out=((4, 3),)),
        op("h", "MatMul", ["drop", "w/read"], out=((B, 3),)),
        op("dw", "MatMul", ["drop", "h"], out=((4, 3),), attrs={"transpose_a": True}),
        op("lr", "Const", out=((),)),
        op("update", "ResourceApplyGradientDescent", ["w", "lr", "dw"], out=()),
    ])
    assert rules(g["mask"], g) == []  # nor does OS-DPOS split it
    dp = data_parallel(g, 2)
    assert dp["mask"].type == "RandomUniform" and "mask/part0" not in dp
    cut = dp[dp["drop/part1"].inputs[1].op]  # a slice of the whole mask
    assert cut.type == "SplitV" and cut.inputs[0].op == "mask"
    assert dp["h/part1"].inputs[0].op == "drop/part1"


B8 = 8


def test_a_concat_on_channels_its_gradient_slices_and_a_mean_gradient_tile_run_per_replica():
    """Inception's branches joined on channels, the Slices of that concat's gradient, the
    Tile of a global average pool's gradient: all cut on the batch, none on the whole
    batch (they were, and moved every branch's activations to device 0 and back)."""
    g = Graph([
        op("x", "Placeholder", out=((B8, 6, 6, 4),)),
        op("a", "Relu", ["x"], out=((B8, 6, 6, 4),)),
        op("b", "Sigmoid", ["x"], out=((B8, 6, 6, 4),)),
        op("axis", "Const", out=((),), dtype="int32", attrs={"value": 3}),
        op("cat", "ConcatV2", ["a", "b", "axis"], out=((B8, 6, 6, 8),)),
        op("offset", "ConcatOffset", ["axis", "shape_a", "shape_a"], out=((4,), (4,)),
           dtype="int32"),
        op("shape_a", "Const", out=((4,),), dtype="int32", attrs={"value": [B8, 6, 6, 4]}),
        op("da", "Slice", ["cat", "offset", "shape_a"], out=((B8, 6, 6, 4),)),
        op("pooled", "Reshape", ["da", "shape_p"], out=((B8, 1, 1, 4),)),
        op("shape_p", "Const", out=((4,),), dtype="int32", attrs={"value": [B8, 1, 1, 4]}),
        op("mult", "Const", out=((4,),), dtype="int32", attrs={"value": [1, 6, 6, 1]}),
        op("tiled", "Tile", ["pooled", "mult"], out=((B8, 6, 6, 4),)),
        op("out", "Relu", ["tiled"], out=((B8, 6, 6, 4),)),
    ])
    dp = data_parallel(g, 2)
    for name in ("cat", "da", "tiled"):  # replicas chained part to part, joins unused
        assert f"{name}/part1" in dp and name not in dp, name
    assert dp["cat/part1"].inputs[0].op == "a/part1"
    assert dp["out/part1"].inputs[0].op == "tiled/part1"
    assert dp["da/part1"].inputs[0].op == "cat/part1"
    # the multiples pass whole: replica 1's own copy of the constant
    assert dp["tiled/part1"].inputs[1].op == "mult/part1"
    assert dp["mult/part1"].attrs["value"] == [1, 6, 6, 1]
    assert replica_of(dp["mult/part1"]) == 1


def test_a_strided_convs_explicit_padding_runs_per_replica_but_padding_rows_does_not():
    """slim's conv2d_same pads before a strided conv: every row padded alike (it ran on the
    whole batch and moved every replica's activations to device 0 and back)."""
    g = Graph([
        op("x", "Placeholder", out=((B8, 6, 6, 4),)),
        op("pads", "Const", out=((4, 2),), dtype="int32",
           attrs={"value": [[0, 0], [1, 1], [1, 1], [0, 0]]}),
        op("padded", "Pad", ["x", "pads"], out=((B8, 8, 8, 4),)),
        op("out", "Relu", ["padded"], out=((B8, 8, 8, 4),)),
        op("rows", "Const", out=((2, 2),), dtype="int32", attrs={"value": [[0, 2], [0, 0]]}),
        op("flat", "Reshape", ["x", "shape"], out=((B8, 144),)),
        op("shape", "Const", out=((2,),), dtype="int32", attrs={"value": [B8, 144]}),
        op("more", "Pad", ["flat", "rows"], out=((B8 + 2, 144),)),
    ])
    dp = data_parallel(g, 2)
    cut = dp[dp["padded/part1"].inputs[0].op]
    assert "padded" not in dp and cut.type == "SplitV" and cut.inputs[0].op == "x"
    assert dp["out/part1"].inputs[0].op == "padded/part1"
    assert dp["padded/part1"].inputs[1].op == "pads/part1"  # its own copy of the paddings
    assert dp["more"].type == "Pad" and replica_of(dp["more"]) is None


def test_each_replica_reads_its_own_copy_of_the_constants():
    """A constant a replica reads (a folded ShapeN: a convolution's gradient reads its
    filter's shape) is copied to each replica rather than sent to each at every step; one
    with a control input, and what shared ops read, stay."""
    g = Graph([
        op("x", "Placeholder", out=((B8, 2, 2, 4),)),
        op("w", "VarHandleOp", out=((),), dtype="resource", is_variable=True),
        op("wv", "ReadVariableOp", ["w"], out=((1, 1, 4, 4),)),
        op("shapes", "ShapeN", ["x", "wv"], out=((4,), (4,)), dtype="int32"),
        op("y", "Conv2D", ["x", "wv"], out=((B8, 2, 2, 4),)),
        op("grad", "Conv2DBackpropFilter", ["x", "shapes:1", "y"], out=((1, 1, 4, 4),)),
        op("half", "Const", out=((),), attrs={"value": 0.5}),
        op("gated", "Const", out=((),), attrs={"value": 2.0}, control=["x"]),
        op("out", "Mul", ["y", "half"], out=((B8, 2, 2, 4),)),
        op("out2", "Mul", ["out", "gated"], out=((B8, 2, 2, 4),)),
        op("scaled", "Mul", ["grad", "half"], out=((1, 1, 4, 4),)),
    ])
    dp = data_parallel(g, 2)
    for k in range(2):
        shape = dp[dp[f"grad/part{k}"].inputs[1].op]  # the filter's: a constant
        assert shape.name == f"shapes/folded1/part{k}" and replica_of(shape) == k
        assert shape.type == "Const" and shape.attrs["value"] == [1, 1, 4, 4]
        assert dp[f"out/part{k}"].inputs[1].op == f"half/part{k}"
        assert dp[f"out2/part{k}"].inputs[1].op == f"gated/part{k}"
        assert dp[f"gated/part{k}"].control_inputs == ("x",)  # waits as the original did
    assert dp["scaled"].inputs[1].op == "half"  # a shared op keeps the original


def test_replicas_wait_for_several_shared_ops_through_one_gate():
    """``with tf.control_dependencies(update_ops): minimize(loss)``: gradient ops wait for
    every moving-average update; each replica's copy waits for one gate that waits for
    them (one message a replica, not one per update)."""
    g = Graph([
        op("x", "Placeholder", out=((B8, 4),)),
        op("u1", "NoOp", out=()), op("u2", "NoOp", out=()),
        op("two", "Const", out=((),), attrs={"value": 2.0}, control=["u1", "u2"]),
        op("y", "Mul", ["x", "two"], out=((B8, 4),)),
        op("z", "Relu", ["y"], out=((B8, 4),), control=["u2", "u1"]),
        op("w", "Relu", ["y"], out=((B8, 4),), control=["u2", "z", "u1"]),
    ])
    dp = data_parallel(g, 2)
    gate = dp["fastt_control_gate0"]
    assert gate.type == "NoOp" and gate.control_inputs == ("u1", "u2")
    for k in range(2):
        assert dp[f"two/part{k}"].control_inputs == (gate.name,)
        assert dp[f"z/part{k}"].control_inputs == (gate.name,)
        w = dp[f"w/part{k}"].control_inputs  # (and z's parts, as the split made them)
        assert w[-1] == gate.name and f"z/part{k}" in w and not {"u1", "u2"} & set(w)
    assert dp["two"].control_inputs == ("u1", "u2")  # (unread now, as it was)
    assert [o.name for o in dp if o.type == "NoOp" and o.name.startswith("fastt_")] == [
        gate.name]


def test_a_gate_on_replicated_ops_gets_one_copy_per_replica():
    """tf.gradients' per-op gate (a NoOp waiting for an op's gradients, then Identities
    behind it): each replica waits for its own copy, not for the slowest replica through a
    control edge to the first device."""
    g = Graph([
        op("x", "Placeholder", out=((B8, 4),)),
        op("a", "Relu", ["x"], out=((B8, 4),)),
        op("b", "Sigmoid", ["x"], out=((B8, 4),)),
        op("gate", "NoOp", out=(), control=["a", "b"]),
        op("a_gated", "Identity", ["a"], control=["gate"], out=((B8, 4),)),
        op("out", "Relu", ["a_gated"], out=((B8, 4),)),
    ])
    dp = data_parallel(g, 2)
    for k in range(2):
        assert set(dp[f"gate/part{k}"].control_inputs) == {f"a/part{k}", f"b/part{k}"}
        assert dp[f"a_gated/part{k}"].control_inputs == (f"gate/part{k}",)
        assert replica_of(dp[f"gate/part{k}"]) == k
    assert dp["gate"].control_inputs == ("gate/part0", "gate/part1")  # waiting for all


def recurrent_graph(B=8, T=3, H=2):
    """An unrolled RNN as TF1 scripts build it: the inputs unstacked on the time axis, each
    step's gates split on the feature axis (an LSTM cell's ``split``), the outputs stacked
    back on the time axis, reshaped to rows, a sparse softmax cross-entropy."""
    ops = [op("x", "Placeholder", out=((B, T, H),)),
           op("labels", "Placeholder", out=((B * T,),), dtype="int32"),
           op("unstack", "Unpack", ["x"], out=((B, H),) * T, attrs={"axis": 1, "num": T}),
           op("dim", "Const", out=((),), dtype="int32", attrs={"value": 1})]
    for t in range(T):
        ops += [op(f"t{t}/split", "Split", ["dim", f"unstack:{t}"], out=((B, 1),) * 2,
                   attrs={"num_split": 2}),
                op(f"t{t}/gate", "Mul", [f"t{t}/split:0", f"t{t}/split:1"], out=((B, 1),))]
    ops += [op("stack", "Pack", [f"t{t}/gate" for t in range(T)], out=((B, T, 1),),
               attrs={"axis": 1, "N": T}),
            op("shape", "Const", out=((2,),), dtype="int32", attrs={"value": [B * T, 1]}),
            op("rows", "Reshape", ["stack", "shape"], out=((B * T, 1),)),
            op("xent", "SparseSoftmaxCrossEntropyWithLogits", ["rows", "labels"],
               out=((B * T,), (B * T, 1))),
            op("grad", "Mul", ["xent:1", "rows"], out=((B * T, 1),))]
    return Graph(ops)


def test_ops_of_several_outputs_are_cut_on_the_rows_and_chained_output_by_output():
    """Nothing of an unrolled RNN runs on the whole batch: each replica unstacks its rows,
    splits its gates, stacks its steps and takes its rows' cross-entropy."""
    g = data_parallel(recurrent_graph(), 2)
    for name in ("unstack", "t0/split", "t2/split", "stack", "xent"):
        assert all(f"{name}/part{k}" in g for k in range(2)), name
    # each output of a part is that replica's rows of the whole op's output
    assert [t.shape for t in g["unstack/part1"].outputs] == [(4, 2)] * 3
    assert [t.shape for t in g["xent/part0"].outputs] == [(12,), (12, 1)]
    # consumers read the same output of their replica's part, not a cut of a join
    assert g["t2/split/part1"].inputs[1].op == "unstack/part1" and \
        g["t2/split/part1"].inputs[1].index == 2
    assert [(r.op, r.index) for r in g["t1/gate/part0"].inputs] == [
        ("t1/split/part0", 0), ("t1/split/part0", 1)]
    assert (g["grad/part1"].inputs[0].op, g["grad/part1"].inputs[0].index) == ("xent/part1", 1)
    # no activation crosses replicas: the only cuts are of the fed tensors
    cuts = sorted(o.name for o in g if o.type == "SplitV")
    assert all(c.endswith("/split_in0") or c.endswith("/split_in1") for c in cuts)
    assert {g[c].inputs[0].op for c in cuts} == {"x", "labels"}
    # a user fetching a whole output still gets it: its concat stays aside
    join = g.meta.dropped_joins["t0/split"]
    assert join.type == "IdentityN" and [r.op for r in join.inputs] == [
        "t0/split/fastt_join0", "t0/split/fastt_join1"]
    assert [(r.op, r.index) for r in g.meta.dropped_joins["t0/split/fastt_join1"].inputs] == [
        ("t0/split/part0", 1), ("t0/split/part1", 1)]


def test_a_split_along_the_rows_is_not_cut():
    """Splitting the batch itself (a split on axis 0) is not row by row: it runs whole."""
    ops = [op("x", "Placeholder", out=((8, 2),)),
           op("dim", "Const", out=((),), dtype="int32", attrs={"value": 0}),
           op("halves", "Split", ["dim", "x"], out=((4, 2),) * 2, attrs={"num_split": 2}),
           op("y", "Relu", ["halves:1"], out=((4, 2),))]
    g = Graph(ops)
    assert rules(g["halves"], g) == []
    assert data_parallel(g, 2)["halves"].type == "Split"
