"""Small CNN reference models: VGG-like (conv-only and with large FC layers), Inception-like."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1
tf1.disable_eager_execution()

from fastt import zoo  # noqa: E402
from fastt.adapters.tf_import import from_tf_graph  # noqa: E402
from fastt.errors import FasttError  # noqa: E402


def trained_losses(m, steps=3):
    with tf1.Session(graph=m.graph) as sess:
        sess.run(m.init)
        return [sess.run([m.loss, m.train_op], m.feed_dict())[0] for _ in range(steps)]


def params(m):
    return {v.op.name: int(np.prod(v.shape.as_list()))
            for v in m.graph.get_collection("trainable_variables")}


@pytest.mark.parametrize("name", ["vgg_like", "vgg_mixed", "inception_like"])
def test_trains_and_imports(name):
    m = zoo.build(name, batch_size=4)
    assert m.name == name
    out = trained_losses(m)
    assert all(np.isfinite(out)) and out[-1] < out[0], out
    assert len(from_tf_graph(m.graph)) == len(m.graph.get_operations())


def test_vgg_mixed_is_the_conv_trunk_plus_large_fc_layers():
    conv, mixed = params(zoo.build("vgg_like")), params(zoo.build("vgg_mixed"))
    trunk = {k: v for k, v in conv.items() if k.startswith("conv")}
    assert trunk == {k: v for k, v in mixed.items() if k.startswith("conv")}
    # 3 pooled blocks: 32x32 -> 4x4x128 = 2048 features into 4096 units, then 4096x4096.
    assert mixed["fc1/weights"] == 2048 * 4096 and mixed["fc2/weights"] == 4096 * 4096
    assert sum(mixed.values()) > 20 * sum(conv.values())


def test_inception_modules_have_four_branches():
    m = zoo.build("inception_like", modules=2, width=8)
    concat = m.graph.get_operation_by_name("mixed_1/concat")
    assert len(concat.inputs) == 5  # four branches and the axis
    assert concat.outputs[0].shape.as_list() == [16, 32, 32, 32]


def test_bad_sizes_are_refused():
    with pytest.raises(FasttError, match="multiple of 8"):
        zoo.build("vgg_like", image_size=36)
    with pytest.raises(FasttError, match="modules"):
        zoo.build("inception_like", modules=0)
