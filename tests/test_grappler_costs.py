"""Per-op time estimates on a simulated V100 from grappler's analytical cost model (no GPU)."""
import logging

import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1
tf1.disable_eager_execution()

from tf_patches import grappler_costs as gc  # noqa: E402

# Free or bookkeeping ops left out of the coverage count: they move no data on a GPU.
NOT_COMPUTE = {"Const", "NoOp", "Identity", "VarHandleOp", "VariableV2", "Placeholder",
               "ReadVariableOp", "Shape", "ShapeN", "Reshape", "ExpandDims"}


def cnn(batch=32):
    """Two convs, a matmul classifier, sparse softmax cross-entropy, SGD."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [batch, 32, 32, 3], name="images")
        y = tf1.placeholder(tf.int32, [batch], name="labels")
        w1 = tf1.get_variable("w1", [3, 3, 3, 16])
        h = tf.nn.relu(tf.nn.conv2d(x, w1, 1, "SAME", name="conv1"))
        w2 = tf1.get_variable("w2", [3, 3, 16, 32])
        h = tf.nn.relu(tf.nn.conv2d(h, w2, 2, "SAME", name="conv2"))
        h = tf.reshape(h, [batch, 16 * 16 * 32])
        w3 = tf1.get_variable("w3", [16 * 16 * 32, 10])
        logits = tf.matmul(h, w3, name="fc")
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=logits))
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
        tf1.global_variables_initializer()  # in the graph, not in the train op's fan-in
    return g.as_graph_def(), train.name


@pytest.fixture(scope="module")
def estimated():
    graph_def, train = cnn(32)
    return graph_def, train, gc.analytical_costs(graph_def, [train], "V100")


def test_convolutions_and_their_gradients_get_positive_times(estimated):
    _, _, costs = estimated
    for name in ("conv1", "conv2", "gradients/conv1_grad/Conv2DBackpropFilter",
                 "gradients/conv1_grad/Conv2DBackpropInput",
                 "gradients/conv2_grad/Conv2DBackpropFilter",
                 "gradients/conv2_grad/Conv2DBackpropInput", "fc"):
        assert costs[name] > 0.0, name
    # Roofline sanity: conv1 at batch 32 on a V100 is ~4.6 us (1.8 us of FLOPs + 2.8 us of
    # HBM traffic, as measured); anything outside 1..50 us means wrong device units.
    assert 1e-6 < costs["conv1"] < 50e-6


def test_four_times_the_batch_costs_clearly_more(estimated):
    _, _, small = estimated
    graph_def, train = cnn(128)
    big = gc.analytical_costs(graph_def, [train], "V100")
    # measured: conv1 4.58 us -> 18.3 us (4.0x), conv2 8.3 us -> 33.3 us
    for name in ("conv1", "conv2", "gradients/conv2_grad/Conv2DBackpropFilter"):
        assert big[name] > 2 * small[name], (name, small[name], big[name])


def test_names_are_the_graphs_and_coverage_of_the_step_is_high(estimated):
    graph_def, train, costs = estimated
    op_type = {n.name: n.op for n in graph_def.node}
    assert set(costs) <= set(op_type)  # no grappler-made or renamed ops
    fanin = gc.fetch_fanin(graph_def, [train])
    init = "w1/Initializer/random_uniform"
    assert init in op_type and init not in fanin
    assert set(costs) == fanin  # the whole training step, nothing else
    relevant = [n for n in fanin if op_type[n] not in NOT_COMPUTE]
    positive = [n for n in relevant if costs.get(n, 0.0) > 0.0]
    # measured: 21/21 = 1.00 of the step's 53 ops minus NOT_COMPUTE; only the 4 NoOps get 0
    assert len(positive) / len(relevant) >= 0.95, sorted(set(relevant) - set(positive))


def test_metagraph_input_and_other_devices(estimated):
    graph_def, train, v100 = estimated
    meta = tf1.train.export_meta_graph(graph_def=graph_def)
    assert gc.analytical_costs(meta, [train], "V100") == v100
    forward = gc.analytical_costs(meta, ["fc:0"], "V100")  # a tensor name: forward pass only
    assert forward["conv1"] == v100["conv1"] and "train" not in forward
    p100 = gc.analytical_costs(graph_def, [train], "P100")
    assert p100["conv2"] > v100["conv2"]  # fewer SMs, less bandwidth


def test_unknown_batch_is_warned_about(caplog):
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 8], name="x")
        out = tf.matmul(x, tf.ones([8, 8]), name="out")
    with caplog.at_level(logging.WARNING, logger="fastt"):
        costs = gc.analytical_costs(g.as_graph_def(), [out.op.name])
    assert "out" in costs
    assert "unknown dimensions" in caplog.text and "'x'" in caplog.text


def test_unknown_device_kind_and_bad_fetch_raise():
    with pytest.raises(ValueError, match="'TPUv9'.*V100"):
        gc.device_properties("TPUv9")
    graph_def, train = cnn(2)
    with pytest.raises(ValueError, match="TPUv9"):
        gc.analytical_costs(graph_def, [train], "TPUv9")
    with pytest.raises(ValueError, match="no_such_op"):
        gc.analytical_costs(graph_def, ["no_such_op"])
    props = gc.device_properties("V100")
    assert props.type == "GPU" and props.num_cores == 80
    assert props.environment["architecture"].startswith("7")
    assert props.bandwidth == 900_000_000  # KB/s
