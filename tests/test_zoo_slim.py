"""tf-slim's ResNet v1 in the zoo as the published V100 benchmarks ran theirs
(``benchmarks/grounding.py`` counts their all-reduces on it): a batch norm with a scale after
every convolution, so weight, gamma and beta per convolution."""
import collections

import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("tf_slim")

from fastt import zoo  # noqa: E402


def test_resnet_v1_50_has_weight_gamma_and_beta_per_convolution():
    m = zoo.build("resnet_v1_50", batch_size=1, image_size=64)
    kinds = collections.Counter(v.op.name.rsplit("/", 1)[-1]
                                for v in m.graph.get_collection("trainable_variables"))
    # 53 convolutions with batch norm, and the logits (a 1x1 convolution with biases):
    # tf_cnn_benchmarks' ResNet-50 v1 all-reduces the same 161 tensors
    assert kinds == {"weights": 54, "gamma": 53, "beta": 53, "biases": 1}
