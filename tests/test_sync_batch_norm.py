"""Batch norm split on the batch with the whole batch's statistics (no TensorFlow; the
equivalence tests run it: small_cnn and resnet_v2_50 normalise in training)."""
import pytest

from fastt.ir import Graph, TensorRef
from fastt.passes.data_parallel import data_parallel
from fastt.passes.replicas import replica_of
from tests.helpers import op

B, H, C = 8, 5, 3


def bn_graph(fmt="NHWC", avg=1.0, stray_reader=False, spatial=H):
    """x -> fused batch norm (training) -> relu -> loss; its gradient; moving averages read
    the batch statistics; the scale's gradient feeds an update."""
    shape = (B, spatial, spatial, C) if fmt == "NHWC" else (B, C, spatial, spatial)
    attrs = {"is_training": True, "data_format": fmt, "epsilon": 1e-3, "T": "float32",
             "U": "float32", "exponential_avg_factor": avg}
    ops = [
        op("x", "Placeholder", out=(shape,)),
        op("gamma", "Const", out=((C,),)), op("beta", "Const", out=((C,),)),
        op("empty", "Const", out=((0,),)),
        op("bn", "FusedBatchNormV3", ["x", "gamma", "beta", "empty", "empty"],
           out=(shape, (C,), (C,), (C,), (C,), None), attrs=attrs),
        op("y", "Relu", ["bn"], out=(shape,)),
        op("avg_mean", "Mul", ["bn:1", "gamma"], out=((C,),)),
        op("avg_var", "Mul", ["bn:2", "gamma"], out=((C,),)),
        op("dy", "ReluGrad", ["y", "y"], out=(shape,)),
        op("dbn", "FusedBatchNormGradV3", ["dy", "x", "gamma", "bn:3", "bn:4", "bn:5"],
           out=(shape, (C,), (C,), (0,), (0,)), attrs=attrs),
        op("dx", "Relu", ["dbn"], out=(shape,)),
        op("v", "VarHandleOp", out=((),), dtype="resource", is_variable=True),
        op("lr", "Const", out=((),)),
        op("update", "ResourceApplyGradientDescent", ["v", "lr", "dbn:1"], out=()),
    ]
    if stray_reader:
        ops.append(op("peek", "Identity", ["bn:3"], out=((C,),)))
    return Graph(ops)


def test_replicas_normalise_their_rows_with_the_whole_batch_statistics():
    g = data_parallel(bn_graph(), 2)
    # Each replica normalises its own rows, chained to its neighbours' parts ...
    assert [g[f"bn/part{k}"].outputs[0].shape for k in range(2)] == [(4, H, H, C)] * 2
    assert g["y/part1"].inputs[0] == TensorRef("bn/part1", 0)
    assert {replica_of(g[f"bn/part{k}"]) for k in range(2)} == {0, 1}
    # ... with the whole batch's moments, which each replica combines itself from every
    # replica's (sum, count, sum of squares about its own mean), sent in one message.
    for k in range(2):
        mean = g[f"bn/fastt_mean{k}"]
        assert replica_of(mean) == k
        unpack = g[g[mean.inputs[0].op].inputs[0].op]
        assert unpack.type == "SplitV" and unpack.attrs["size_splits"] == [C, 1, C]
        table = g[unpack.inputs[0].op]
        assert table.type == "Pack" and replica_of(table) == k
        assert [r.op for r in table.inputs] == ["bn/fastt_moments_pack0",
                                                "bn/fastt_moments_pack1"]
        assert [r.op for r in g[f"bn/fastt_moments_pack{k}"].inputs] == [
            f"bn/fastt_sum{k}", f"bn/fastt_rows{k}", f"bn/fastt_sq_sum{k}"]
        # its rows are centred on their own mean, counted from their own size (no message)
        centred = g[f"bn/fastt_centred{k}"]
        assert centred.inputs[1].op == f"bn/fastt_local_mean{k}"
        assert g[f"bn/fastt_size{k}"].type == "Size"
        assert g[f"bn/fastt_size{k}"].inputs[0] == centred.inputs[0]
        # the variance adds the spread between the replicas' means to their own
        spread = g[g[f"bn/fastt_var{k}"].inputs[0].op]
        assert [r.op for r in spread.inputs] == [f"bn/fastt_sq_all{k}", f"bn/fastt_between{k}"]
        # y is shifted by the distance of the local mean to the batch's
        assert [r.op for r in g[f"bn/fastt_shift{k}"].inputs] == [
            f"bn/fastt_local_mean{k}", mean.name]
        assert g[f"bn/part{k}"].inputs[1].op == f"bn/fastt_offset_shifted{k}"
        # the gradient's two sums travel in one message (a pack, unpacked after the sum)
        assert [r.op for r in g[f"dbn/fastt_d_offset_pack{k}"].inputs] == [
            f"dbn/fastt_dy_sum{k}", f"dbn/fastt_dot{k}"]
        assert [r.op for r in g[f"dbn/fastt_dot{k}"].inputs] == [
            f"dbn/fastt_dot_local{k}", f"dbn/fastt_dot_shift{k}"]
        unpack = g[g[f"dbn/fastt_d_scale{k}"].inputs[0].op]
        assert unpack.type == "SplitV" and unpack.attrs["size_splits"] == [C, C]
        assert [r.op for r in g[unpack.inputs[0].op].inputs] == [
            "dbn/fastt_d_offset_pack0", "dbn/fastt_d_offset_pack1"]
    # two exchanges a batch norm: no other op reads another replica's op
    crossing = {(o.name, r.op) for o in g for r in o.inputs
                if o.name.startswith(("bn/", "dbn/")) and replica_of(o) is not None and
                g[r.op].name.startswith(("bn/", "dbn/")) and replica_of(g[r.op]) is not None
                and replica_of(g[r.op]) != replica_of(o)}
    assert {src.rsplit("/fastt_", 1)[1][:-1] for _, src in crossing} == {
        "moments_pack", "d_offset_pack"}
    assert g["bn/fastt_sum1"].inputs[0].op == "x/split_in0" or \
        g["bn/fastt_sum1"].inputs[0] == g["bn/fastt_centred1"].inputs[0]
    # The fused ops and their concats are not scheduled (kept for a user's fetch): no
    # activation crosses replicas, and no op is shared by them (each has its constants).
    for name, concat in (("bn", "bn/fastt_y"), ("dbn", "dbn/fastt_dx")):
        assert name not in g and concat not in g
        assert {name, concat} <= set(g.meta.dropped_joins)
    # (dx ends this graph: its join stays for whoever fetches it)
    assert [o.name for o in g if o.type == "ConcatV2" and "_pack" not in o.name] == ["dx"]
    assert all(replica_of(o) is not None for o in g
               if o.name.startswith(("bn/", "dbn/")) and "/split_in" not in o.name)
    # The moving averages read the batch statistics (the unbiased variance), the update
    # the summed gradient of the scale.
    assert g["avg_mean"].inputs[0] == TensorRef("bn/fastt_mean0", 0)
    assert g["avg_var"].inputs[0] == TensorRef("bn/fastt_var_unbiased0", 0)
    assert g["update"].inputs[2] == TensorRef("dbn/fastt_d_scale0", 0)
    # The gradient reuses the forward's centred rows.
    assert g["dbn/fastt_dy_c0"].inputs[1] == TensorRef("bn/fastt_centred0", 0)
    # The replicas' ops share the fused ops' work exactly.
    for name in ("bn", "dbn"):
        assert sum(o.meta.fraction for o in g if o.meta.origin == name) == pytest.approx(1.0)


def test_without_a_known_shape_the_statistics_are_the_same_ops():
    """A replica counts its own rows from their size at run time, so an image size not
    known when planning changes nothing."""
    known, unknown = data_parallel(bn_graph(), 2), data_parallel(bn_graph(spatial=None), 2)
    names = sorted(o.name for o in known if o.name.startswith(("bn/", "dbn/")))
    assert names == sorted(o.name for o in unknown if o.name.startswith(("bn/", "dbn/")))
    assert unknown["bn/fastt_size1"].type == "Size"


def test_channels_first_statistics_broadcast_over_rows():
    g = data_parallel(bn_graph("NCHW"), 2)
    assert g["bn/fastt_axes1"].attrs["value"] == [0, 2, 3]
    assert g["bn/fastt_centred1"].inputs[1].op == "bn/fastt_local_mean_bcast1"
    assert g["bn/fastt_local_mean_bcast1"].attrs["shape"] == [C, 1, 1]
    assert g["bn/part1"].inputs[1].op == "bn/fastt_offset_bcast1"


@pytest.mark.parametrize("kw", [{"avg": 0.1}, {"stray_reader": True}])
def test_a_batch_norm_it_cannot_reproduce_runs_whole(kw):
    """A running average inside the op, or its saved statistics read by something else than
    its gradient: the op runs once on the whole batch, as before."""
    g = data_parallel(bn_graph(**kw), 2)
    assert g["bn"].type == "FusedBatchNormV3" and "bn/part0" not in g
    assert g["dbn"].type == "FusedBatchNormGradV3"


def test_what_a_batch_norm_waited_for_its_replicas_wait_for():
    # a recomputed batch norm waits for the backward pass to reach it (control inputs): its
    # replicas' first ops must wait alike, or the copy runs in the forward pass
    g0 = bn_graph()
    g0 = g0.replace_ops({"bn": g0["bn"].with_(control_inputs=("dy",)),
                         "dy": g0["dy"].with_(inputs=(TensorRef("x", 0), TensorRef("x", 0)))})
    g = data_parallel(g0, 2)
    made = [o for o in g if o.meta.origin == "bn" or o.name.startswith("bn/")]
    roots = [o for o in made if not any(r.op in {m.name for m in made} for r in o.inputs)]
    assert roots and all(any(c.startswith("dy") for c in o.control_inputs) for o in roots)
    for o in made:  # every op made waits for it, through its inputs or its own edges
        assert "dy" in o.control_inputs or any(c.startswith("dy/") for c in o.control_inputs) \
            or any(r.op in {m.name for m in made} for r in o.inputs)
