"""IR from real TensorFlow graphs: exact ops and edges, bytes, files, shapes, loops, errors."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1
tf1.disable_eager_execution()

from fastt import zoo  # noqa: E402
from fastt.adapters import tf_import  # noqa: E402
from fastt.adapters.export import to_graph_def  # noqa: E402
from fastt.adapters.runner import traced_run  # noqa: E402
from fastt.errors import GraphFormatError, UnknownDtypeError  # noqa: E402
from fastt.ir import TensorRef  # noqa: E402
from fastt.profiler import profile  # noqa: E402


def tf_edges(g):
    return {(t.op.name, t.value_index, op.name, i)
            for op in g.get_operations() for i, t in enumerate(op.inputs)}


@pytest.fixture(scope="module", params=[("vgg_19", {}), ("inception_v3", {"batch_size": 2})],
                ids=["vgg_19", "inception_v3"])
def slim_model(request):
    name, kwargs = request.param
    return zoo.build(name, **kwargs)


def test_slim_training_graph_ir_is_exact(slim_model):
    g = slim_model.graph
    ir = tf_import.from_tf_graph(g)
    assert set(ir.names) == {op.name for op in g.get_operations()}
    assert set(ir.data_edges()) == tf_edges(g)
    assert set(ir.control_edges()) == {(c.name, op.name) for op in g.get_operations()
                                       for c in op.control_inputs}
    assert any(op.type.startswith("ResourceApply") for op in ir)  # the optimizer is there
    checked = 0
    for tf_op in g.get_operations():
        for i, t in enumerate(tf_op.outputs):
            spec = ir[tf_op.name].outputs[i]
            assert spec.dtype == t.dtype.name
            if t.shape.is_fully_defined():
                if t.dtype.size > 0:
                    assert spec.nbytes == t.dtype.size * t.shape.num_elements(), (tf_op.name, i)
                    checked += 1
                else:  # resource handles, strings, variants: no fixed size
                    assert spec.nbytes is None
    assert checked > 500


def _node_key(n):
    """Data inputs in order; control inputs as a set (TensorFlow itself lists them in
    different orders in ``op.node_def`` and ``as_graph_def()``)."""
    data = tuple(i for i in n.input if not i.startswith("^"))
    control = frozenset(i for i in n.input if i.startswith("^"))
    return n.name, n.op, data, control, n.device


def test_round_trip_through_graph_def_keeps_ops_and_edges(slim_model):
    ir = tf_import.from_tf_graph(slim_model.graph)
    back = to_graph_def(ir)
    original = slim_model.graph.as_graph_def()
    assert {_node_key(n) for n in back.node} == {_node_key(n) for n in original.node}
    again = tf_import.from_graph_def(back)
    assert set(again.names) == set(ir.names)
    assert set(again.data_edges()) == set(ir.data_edges())
    assert set(again.control_edges()) == set(ir.control_edges())


def test_graph_and_meta_graph_files(tmp_path):
    model = zoo.build("small_cnn")
    g = model.graph
    tf1.train.export_meta_graph(filename=str(tmp_path / "m.meta"), graph=g)
    tf.io.write_graph(g, str(tmp_path), "g.pb", as_text=False)
    tf.io.write_graph(g, str(tmp_path), "g.pbtxt", as_text=True)
    names = {op.name for op in g.get_operations()}
    for f in ("m.meta", "g.pb", "g.pbtxt"):
        ir = tf_import.load_graph(tmp_path / f)
        assert set(ir.names) == names, f
        assert set(ir.data_edges()) == tf_edges(g), f
    meta = tf_import.load_graph(tmp_path / "m.meta")
    assert model.train_op.name in meta.meta.collections["train_op"]


def mlp_unknown_batch():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        w = tf1.get_variable("w", [8, 4])
        y = tf.nn.relu(tf.matmul(x, w), name="y")
        init = tf1.global_variables_initializer()
    return g, x, y, init


def test_unknown_shapes_resolved_by_sample_feed_or_run_metadata():
    g, x, y, init = mlp_unknown_batch()
    ir = tf_import.from_tf_graph(g)
    assert ir["y"].outputs[0].nbytes is None
    fed = tf_import.with_feed_shapes(g.as_graph_def(), {"x": (5, 8)})
    assert fed["y"].outputs[0].shape == (5, 4) and fed["y"].outputs[0].nbytes == 80
    with tf1.Session(graph=g) as sess:
        sess.run(init)
        _, meta = traced_run(sess, y, {x: np.ones((3, 8), np.float32)})
    p = profile(meta, ir)
    refined = ir.with_output_shapes(p.output_shapes, p.output_bytes)
    assert refined["y"].outputs[0].shape == (3, 4)
    assert refined["y"].outputs[0].nbytes == 48
    assert refined[p.fused["y"][0] if "y" in p.fused else "MatMul"].outputs[0].nbytes in (48, None)


def test_while_loops_are_reported_not_crashed_on():
    tf1.disable_control_flow_v2()
    try:
        g = tf.Graph()
        with g.as_default():
            i0 = tf.constant(0)
            tf1.while_loop(lambda i: i < 10, lambda i: i + 1, [i0], name="count")
    finally:
        tf1.enable_control_flow_v2()
    ir = tf_import.from_tf_graph(g)
    summary = ir.loop_summary()
    assert len(summary["while_frames"]) == 1 and list(summary["while_frames"].values())[0] >= 5
    assert len(ir.topological_order()) == len(ir)
    g2 = tf.Graph()
    with g2.as_default():
        tf1.while_loop(lambda i: i < 10, lambda i: i + 1, [tf.constant(0)], name="count")
    assert tf_import.from_tf_graph(g2).loop_summary()["functional_loops"]


def test_bad_inputs_give_clear_errors(tmp_path):
    with pytest.raises(GraphFormatError, match="does not exist"):
        tf_import.load_graph(tmp_path / "nope.pb")
    with pytest.raises(GraphFormatError, match="is a directory"):
        tf_import.load_graph(tmp_path)
    (tmp_path / "junk.pb").write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(GraphFormatError, match="not a TensorFlow GraphDef or MetaGraphDef"):
        tf_import.load_graph(tmp_path / "junk.pb")
    (tmp_path / "notes.txt").write_text("hello: world\n")
    with pytest.raises(GraphFormatError, match="not a TensorFlow GraphDef or MetaGraphDef"):
        tf_import.load_graph(tmp_path / "notes.txt")

    gd = tf.compat.v1.GraphDef()
    node = gd.node.add(name="p", op="Placeholder")
    node.attr["dtype"].type = 999
    (tmp_path / "dtype.pb").write_bytes(gd.SerializeToString())
    with pytest.raises(UnknownDtypeError,
                       match=r"op 'p' \(Placeholder\) attr 'dtype': unknown dtype enum value 999"):
        tf_import.load_graph(tmp_path / "dtype.pb")

    gd = tf.compat.v1.GraphDef()
    gd.node.add(name="q", op="NoSuchOpType")
    (tmp_path / "op.pb").write_bytes(gd.SerializeToString())
    with pytest.raises(GraphFormatError, match="NoSuchOpType"):
        tf_import.load_graph(tmp_path / "op.pb")

    with pytest.raises(GraphFormatError, match="'nothere'"):
        tf_import.with_feed_shapes(mlp_unknown_batch()[0].as_graph_def(), {"nothere": (1,)})


def test_refs_are_tensor_refs():
    g, *_ = mlp_unknown_batch()
    ir = tf_import.from_tf_graph(g)
    assert ir["y"].inputs == (TensorRef("MatMul", 0),)


def test_shapes_of_fused_ops_are_inferred_from_the_measured_inputs():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 8, 8, 3], name="x")
        w = tf1.get_variable("w", [3, 3, 3, 4])
        b = tf1.get_variable("b", [4])
        y = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME", name="conv"), b), name="y")
        init = tf1.global_variables_initializer()
    ir = tf_import.from_tf_graph(g)
    with tf1.Session(graph=g) as sess:
        sess.run(init)
        _, meta = traced_run(sess, y, {x: np.ones((6, 8, 8, 3), np.float32)})
    p = profile(meta, ir)
    shapes = tf_import.inferred_shapes(g.as_graph_def(), {"x:0": (6, 8, 8, 3)})
    assert shapes[TensorRef("conv", 0)] == (6, 8, 8, 4)  # whether or not the run reported it
    assert shapes[TensorRef("y", 0)] == (6, 8, 8, 4)
    refined = ir.with_output_shapes({**shapes, **p.output_shapes})
    assert all(t.fully_defined for op in refined for t in op.outputs if op.type != "NoOp")
    assert tf_import.inferred_shapes(g.as_graph_def(), {"x:0": (6, 5)}) == {}  # rank clash


def test_iterator_outputs_pinned_to_their_measured_shapes():
    g = tf.Graph()
    with g.as_default():
        ds = tf.data.Dataset.from_tensor_slices(np.zeros((10, 4), np.float32)).batch(5)
        batch = tf1.data.make_one_shot_iterator(ds).get_next()
        tf.reduce_sum(tf.square(batch), axis=1, name="y")
    assert tf_import.from_tf_graph(g)["y"].outputs[0].shape == (None,)
    shapes = tf_import.inferred_shapes(g.as_graph_def(), {f"{batch.op.name}:0": (5, 4)})
    assert shapes[TensorRef("y", 0)] == (5,)


def test_updates_of_reference_variables_are_stateful_and_make_a_training_step():
    """``disable_v2_behavior()`` scripts build reference variables, whose updates write
    through a reference input and are not stateful in their OpDef."""
    from fastt.ir import writes_variable
    from fastt.plugin.step_finder import updates_trainables
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 3])
        w = tf1.Variable(tf1.zeros([3, 1]), use_resource=False, name="w")
        loss = tf.reduce_mean(tf.matmul(x, w))
        train = tf1.train.AdamOptimizer(0.1).minimize(loss)
        init = tf1.global_variables_initializer()
    ir = tf_import.from_tf_graph(g)
    assert ir["w"].type == "VariableV2"
    writers = sorted(op.type for op in ir if writes_variable(op))
    assert "ApplyAdam" in writers and "Assign" in writers
    assert updates_trainables(ir, [train.name], {"w"})
    assert not updates_trainables(ir, [init.name], {"w"})


def test_ncclallreduce_ops_fastt_makes_are_valid_tensorflow_ops():
    """On GPUs of one process the all-reduce is NCCL's: the GraphDef fastt writes imports
    into TensorFlow with NcclAllReduce's own attributes (its kernel needs GPUs: not run)."""
    from fastt.ir import Graph, Op, OpMeta, TensorSpec
    from fastt.passes.ring import _collective
    spec = TensorSpec("float32", (6,))
    bufs = [Op(name=f"buf{k}", type="Const", outputs=(spec,),
               attrs={"value": [float(k)] * 6, "dtype": "float32"}, meta=OpMeta(replica=k))
            for k in range(2)]
    ops = _collective("fastt_allreduce/bucket0", [TensorRef(b.name, 0) for b in bufs], spec)
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.import_graph_def(to_graph_def(Graph(bufs + ops)), name="")
    op = g.get_operation_by_name("fastt_allreduce/bucket0/summed/part1")
    assert op.type == "NcclAllReduce" and op.get_attr("num_devices") == 2
    assert op.get_attr("reduction") == b"sum" and op.inputs[0].op.name == "buf1"
    assert [c.name for c in op.control_inputs] == ["buf0"]
