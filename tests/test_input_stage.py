"""Which iterators stay in the user's session: those whose dataset runs Python or draws
random numbers with a stateful op."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1
tf1.disable_eager_execution()

from fastt.plugin.state import unsaved  # noqa: E402


def _graph(make):
    g = tf.Graph()
    with g.as_default():
        it = make()
        it.get_next()
    return g, it._iterator_resource.op.name


def _gen():
    for i in range(8):
        yield np.float32(i)


@pytest.mark.parametrize("make,expected", [
    (lambda: tf1.data.make_initializable_iterator(tf.data.Dataset.from_generator(
        _gen, tf.float32, tf.TensorShape([])).batch(2)), True),
    (lambda: tf1.data.make_one_shot_iterator(tf.data.Dataset.range(8).map(
        lambda v: tf1.py_func(lambda a: a * 2, [v], tf.int64)).batch(2)), True),
    (lambda: tf1.data.make_initializable_iterator(tf.data.Dataset.range(8).shuffle(
        4, seed=1).map(lambda v: v * 2).batch(2)), False),
    (lambda: tf1.data.make_one_shot_iterator(tf.data.Dataset.range(8).batch(2)), False),
    (lambda: tf1.data.make_one_shot_iterator(tf.data.Dataset.range(8).map(
        lambda v: tf.cast(v, tf.float32) + tf1.random_uniform([], seed=3)).batch(2)), True)])
def test_iterators_over_python_or_random_draws_are_found(make, expected):
    g, name = _graph(make)
    iterators, functions = unsaved(g)
    assert (name in iterators) is expected
    assert bool(functions) is expected
