"""The zoo builds its graphs with tensor equality off (``tf_patches.graph_build``): the same
ops as with it on, the setting restored after."""
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("tf_slim")

from tensorflow.python.framework import tensor as tensor_lib  # noqa: E402

from fastt import zoo  # noqa: E402
from tf_patches.graph_build import identity_equality  # noqa: E402


def graph_def_bytes(m):
    return m.graph.as_graph_def().SerializeToString(deterministic=True)


def test_the_same_graph_is_built_with_and_without():
    # tf-slim's batch norms hash every global variable each time they add one
    kwargs = {"batch_size": 2, "image_size": 32}
    saved = tensor_lib.Tensor._USE_EQUALITY
    tensor_lib.Tensor._USE_EQUALITY = True  # TensorFlow 2's default
    try:
        fast = zoo.build("resnet_v2_50", **kwargs)
        assert tensor_lib.Tensor._USE_EQUALITY  # restored
        zoo._load_all()
        plain = zoo._REGISTRY["resnet_v2_50"](**kwargs)  # the builder without the block
    finally:
        tensor_lib.Tensor._USE_EQUALITY = saved
    assert len(fast.graph.get_operations()) == len(plain.graph.get_operations()) > 1000
    assert graph_def_bytes(fast) == graph_def_bytes(plain)


@pytest.mark.parametrize("before", [True, False])
def test_the_setting_is_restored_after_an_error(before):
    saved = tensor_lib.Tensor._USE_EQUALITY
    tensor_lib.Tensor._USE_EQUALITY = before
    try:
        with pytest.raises(RuntimeError), identity_equality():
            assert not tensor_lib.Tensor._USE_EQUALITY
            raise RuntimeError("a builder failed")
        assert tensor_lib.Tensor._USE_EQUALITY is before
    finally:
        tensor_lib.Tensor._USE_EQUALITY = saved
