"""Training graphs of reference models (tf.compat.v1), for the demo, the tests and benchmarks.

``build(name, ...)`` returns a ``TrainingGraph``: the ``tf.Graph`` with its loss, train op,
initializer and a sample batch for every placeholder.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from fastt.errors import FasttError

_tf1 = tf.compat.v1


@dataclass
class TrainingGraph:
    name: str
    graph: tf.Graph
    loss: Any
    train_op: Any
    init: Any
    feeds: dict[str, np.ndarray] = field(default_factory=dict)  # placeholder name -> batch

    def feed_dict(self) -> dict[Any, np.ndarray]:
        return {self.graph.get_tensor_by_name(k + ":0"): v for k, v in self.feeds.items()}


def optimizer(name: str, learning_rate: float = 0.01) -> Any:
    if name == "sgd":
        return _tf1.train.GradientDescentOptimizer(learning_rate)
    if name == "momentum":
        return _tf1.train.MomentumOptimizer(learning_rate, 0.9)
    if name == "adam":
        return _tf1.train.AdamOptimizer(learning_rate)
    raise FasttError(f"unknown optimizer {name!r} (choose sgd, momentum or adam)")


def classifier(name: str, body: Callable[..., Any], image_shape: Sequence[int], classes: int,
               batch_size: int, opt: str, seed: int, dtype: Any = tf.float32,
               learning_rate: float = 0.01) -> TrainingGraph:
    """A classification training graph: ``logits = body(images)``, softmax cross-entropy."""
    g = tf.Graph()
    rng = np.random.RandomState(seed)
    with g.as_default():
        _tf1.set_random_seed(seed)
        x = _tf1.placeholder(dtype, [batch_size, *image_shape], name="images")
        y = _tf1.placeholder(tf.int32, [batch_size], name="labels")
        logits = body(x)
        loss = _tf1.losses.sparse_softmax_cross_entropy(y, logits)
        with _tf1.control_dependencies(_tf1.get_collection(_tf1.GraphKeys.UPDATE_OPS)):
            train_op = optimizer(opt, learning_rate).minimize(  # batch norms' averages too
                loss, global_step=_tf1.train.get_or_create_global_step(),
                colocate_gradients_with_ops=True)
        init = _tf1.group(_tf1.global_variables_initializer(), _tf1.local_variables_initializer())
    feeds = {"images": rng.rand(batch_size, *image_shape).astype(dtype.as_numpy_dtype),
             "labels": rng.randint(0, classes, batch_size).astype(np.int32)}
    return TrainingGraph(name, g, loss, train_op, init, feeds)


_REGISTRY: dict[str, Callable[..., TrainingGraph]] = {}


def register(name: str) -> Callable[[Callable[..., TrainingGraph]], Callable[..., TrainingGraph]]:
    def wrap(fn: Callable[..., TrainingGraph]) -> Callable[..., TrainingGraph]:
        _REGISTRY[name] = fn
        return fn
    return wrap


def names() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def build(name: str, **kwargs: Any) -> TrainingGraph:
    """Build model ``name`` (see ``names()``); keyword arguments go to its builder."""
    _load_all()
    if name not in _REGISTRY:
        raise FasttError(f"unknown model {name!r}; known models: {', '.join(sorted(_REGISTRY))}")
    from tf_patches.graph_build import identity_equality
    with identity_equality():  # the same graph, built about twice as fast (see there)
        return _REGISTRY[name](**kwargs)


def _load_all() -> None:
    from fastt.zoo import cnn, nlp, slim_nets  # noqa: F401  (they register their models)
