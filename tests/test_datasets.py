"""What a tf.data pipeline yields and holds, read from its graph before it runs
(``fastt.adapters.datasets``)."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1

from fastt.adapters.datasets import iterator_batches, iterator_pipelines  # noqa: E402

X = np.zeros((100, 4), np.float32)  # 1600 bytes
Y = np.zeros((100,), np.int64)  # 800 bytes


def pipelines(build):
    g = tf.Graph()
    with g.as_default():
        build()
    return iterator_pipelines(g.as_graph_def())


def test_a_one_shot_iterators_batch_and_arrays_are_read_from_its_dataset_function():
    def build():
        ds = tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(10).batch(32).repeat()
        tf1.data.make_one_shot_iterator(ds).get_next(name="next")
    p = pipelines(build)
    assert set(p) == {"next"} and p["next"].batch == 32 and p["next"].held_bytes == 2400


def test_a_reinitializable_iterator_has_a_batch_only_where_its_datasets_agree():
    def build(sizes):
        def make():
            it = tf1.data.Iterator.from_structure(tf.float32, tf.TensorShape([None, 4]))
            for n in sizes:
                it.make_initializer(tf.data.Dataset.from_tensor_slices(X).batch(n))
            it.get_next(name="next")
        return make
    assert pipelines(build([16, 16]))["next"].batch == 16
    agree = pipelines(build([16, 8]))["next"]
    assert agree.batch is None and agree.held_bytes == 3200  # both datasets' arrays
    g = tf.Graph()
    with g.as_default():
        build([16])()
    assert iterator_batches(g.as_graph_def()) == {"next": 16}


def test_a_batch_that_is_unbatched_after_is_not_the_batch_yielded():
    def build():
        ds = tf.data.Dataset.from_tensor_slices(X).batch(10).unbatch().batch(5)
        tf1.data.make_one_shot_iterator(ds).get_next(name="next")

    def unbatched():
        ds = tf.data.Dataset.from_tensor_slices(X).batch(10).unbatch()
        tf1.data.make_one_shot_iterator(ds).get_next(name="next")
    assert pipelines(build)["next"].batch == 5
    assert pipelines(unbatched)["next"].batch is None


def test_a_pipeline_from_a_placeholder_holds_no_constant_and_a_variable_batch_none():
    def build():
        x = tf1.placeholder(tf.float32, [None, 4])
        n = tf1.placeholder(tf.int64, [])
        it = tf1.data.make_initializable_iterator(tf.data.Dataset.from_tensor_slices(x).batch(n))
        it.get_next(name="next")
    p = pipelines(build)["next"]
    assert p.batch is None and p.held_bytes == 0
