"""NLP reference models (Transformer, BERT, LSTM LM, GNMT): they train, are seeded, run in float64,
unroll without loops, and import into the IR."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1
tf1.disable_eager_execution()

from fastt import zoo  # noqa: E402
from fastt.adapters.tf_import import from_tf_graph  # noqa: E402
from fastt.errors import FasttError  # noqa: E402

MODELS = ["transformer", "lstm_lm", "gnmt"]
SMALL_BERT = {"layers": 2, "d_model": 64, "heads": 4, "d_ff": 128, "seq_len": 16, "vocab": 100}
CASES = [("transformer", {}), ("lstm_lm", {}), ("gnmt", {}), ("gnmt", {"attention": "bahdanau"}),
         ("bert", SMALL_BERT)]
LOOP_OPS = {"Enter", "Exit", "NextIteration", "LoopCond", "While", "StatelessWhile"}


def losses(model, steps=3):
    """Initial loss, the loss at each of ``steps`` training steps, and the final loss."""
    with tf1.Session(graph=model.graph) as sess:
        sess.run(model.init)
        feed = model.feed_dict()
        out = [sess.run(model.loss, feed)]
        for _ in range(steps):
            out.append(sess.run([model.loss, model.train_op], feed)[0])
        out.append(sess.run(model.loss, feed))
    return out


def initial_loss(model):
    with tf1.Session(graph=model.graph) as sess:
        sess.run(model.init)
        return sess.run(model.loss, model.feed_dict())


@pytest.fixture(scope="module", params=CASES, ids=["transformer", "lstm_lm", "gnmt",
                                                   "gnmt_bahdanau", "bert"])
def model(request):
    name, kwargs = request.param
    return zoo.build(name, **kwargs)


def test_registered():
    assert set(MODELS) <= set(zoo.names())


def test_trains_three_steps(model):
    out = losses(model)
    assert all(np.isfinite(v) for v in out), out
    assert out[-1] != out[0], out
    assert model.loss.dtype == tf.float32


def test_feeds_match_placeholders(model):
    extra = {"gnmt": {"decoder_tokens"}, "bert": {"positions"}}.get(model.name, set())
    assert set(model.feeds) == {"tokens", "targets"} | extra
    for name, batch in model.feeds.items():
        ph = model.graph.get_tensor_by_name(name + ":0")
        assert ph.op.type == "Placeholder" and ph.dtype == tf.int32
        assert tuple(ph.shape.as_list()) == batch.shape and batch.dtype == np.int32
        assert batch.min() >= 0 and batch.max() < 100  # the vocabularies here are 100


def test_unrolled_without_loops(model):
    types = {op.type for op in model.graph.get_operations()}
    assert not types & LOOP_OPS
    if model.name != "lstm_lm":  # attention: batched matmuls and a softmax
        assert "BatchMatMulV2" in types and "Softmax" in types
    assert any(t.startswith("ResourceApply") for t in types)  # the optimizer is there


def test_ir_import_accepts_the_graph(model):
    ir = from_tf_graph(model.graph, name=model.name)
    assert set(ir.names) == {op.name for op in model.graph.get_operations()}
    assert ir["tokens"].outputs[0].dtype == "int32"
    assert ir["loss"].outputs[0].dtype == "float32"


def test_transformer_scopes_per_layer():
    m = zoo.build("transformer", layers=2)
    names = {op.name for op in m.graph.get_operations()}
    for i in range(2):
        for part in ("attention", "attention_norm", "ffn", "ffn_norm"):
            assert any(n.startswith(f"layer_{i}/{part}/") for n in names), (i, part)
    assert not any(n.startswith("layer_2/") for n in names)


@pytest.mark.parametrize("name", MODELS)
def test_same_seed_same_initial_values(name):
    a, b = initial_loss(zoo.build(name, seed=7)), initial_loss(zoo.build(name, seed=7))
    assert a.tobytes() == b.tobytes()  # bitwise equal
    assert initial_loss(zoo.build(name, seed=8)) != a


@pytest.mark.parametrize("name,opt", [("transformer", "momentum"), ("lstm_lm", "adam"),
                                      ("gnmt", "adam")])
def test_float64(name, opt):
    m = zoo.build(name, dtype=tf.float64, opt=opt)
    assert m.loss.dtype == tf.float64
    # Every model variable is float64; only the step counter and Adam's beta powers (made by
    # the tf.compat.v1 optimizer itself) are not.
    others = {v.op.name for v in m.graph.get_collection("variables") if v.dtype != tf.float64}
    assert others <= {"global_step", "beta1_power", "beta2_power"}
    out = losses(m)
    assert all(np.isfinite(v) for v in out) and out[-1] != out[0]
    from_tf_graph(m.graph)


def test_optimizers_small_sizes():
    for name, kwargs in [("transformer", {"layers": 1, "seq_len": 4}),
                         ("lstm_lm", {"layers": 1, "seq_len": 3}),
                         ("gnmt", {"layers": 1, "src_len": 3, "tgt_len": 3})]:
        for opt in ("sgd", "momentum", "adam"):
            out = losses(zoo.build(name, opt=opt, **kwargs), steps=1)
            assert all(np.isfinite(v) for v in out) and out[-1] != out[0], (name, opt)
    with pytest.raises(FasttError, match="unknown optimizer"):
        zoo.build("lstm_lm", opt="rmsprop")


def test_bert_predicts_at_masked_positions_only():
    m = zoo.build("bert", **SMALL_BERT)
    positions = m.feeds["positions"]
    assert positions.shape == (4, 2)  # 15% of 16 tokens, per sequence
    assert all(len(set(row)) == len(row) for row in positions)
    assert m.graph.get_tensor_by_name("logits/BiasAdd:0").shape.as_list() == [8, 100]
    assert "Erfc" in {op.type for op in m.graph.get_operations()}  # GELU, exact form
    with pytest.raises(FasttError, match="predictions"):
        zoo.build("bert", **{**SMALL_BERT, "predictions": 17})


def test_bad_arguments():
    with pytest.raises(FasttError, match="multiple of heads"):
        zoo.build("transformer", d_model=30, heads=4)
    with pytest.raises(FasttError, match="unknown attention"):
        zoo.build("gnmt", attention="dot")
    with pytest.raises(FasttError, match="floating"):
        zoo.build("lstm_lm", dtype=tf.int32)
    with pytest.raises(FasttError, match="layers"):
        zoo.build("lstm_lm", layers=0)


def test_base_size_transformer_builds():
    # Construction only (about 1.5 s): 4303 ops with the Adam training step, 99 trainable
    # variables, ~19M parameters without the (here 100-token) vocabulary.
    m = zoo.build("transformer", layers=6, d_model=512, heads=8, d_ff=2048, seq_len=128,
                  batch_size=8)
    ops = m.graph.get_operations()
    assert 3000 < len(ops) < 6000
    params = sum(int(np.prod(v.shape.as_list()))
                 for v in m.graph.get_collection("trainable_variables"))
    per_layer = 4 * (512 * 512 + 512) + 2 * 512 * 2048 + 2048 + 512 + 4 * 512
    assert params == 6 * per_layer + 100 * 512 + 512 * 100 + 100
    assert m.graph.get_tensor_by_name("layer_5/attention/MatMul:0").shape.as_list() == \
        [8, 8, 128, 128]
    assert len(from_tf_graph(m.graph).names) == len(ops)
