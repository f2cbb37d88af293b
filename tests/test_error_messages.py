"""TensorFlow's error messages parsed in linear time (``tf_patches.error_messages``): the same
result as TensorFlow's parser, and a message of 2 MB without a tag (a gRPC worker's
"received twice" abort quoting its fed tensors) parsed at once rather than for minutes."""
import threading

import pytest

tf = pytest.importorskip("tensorflow")
from tensorflow.python.framework import error_interpolation  # noqa: E402

from tf_patches import error_messages  # noqa: E402

MESSAGES = [
    "",
    "no tag at all",
    "123{{node Foo}}456{{function_node Bar}}789",
    "{{function_node a/b_c.d}}{{node x/y-1}}",
    "Incompatible shapes: [2] vs. [3]\n\t [[{{node gradients/add_grad/BroadcastGradientArgs}}]]",
    "{{node}} {{ node A}} {{node A B}} {{colocation_node C}}}} {{{node D}}",
    "nested {{function_node f}} then {{node n}} and again {{function_node g}} end",
]


@pytest.mark.parametrize("message", MESSAGES)
def test_same_result_as_tensorflows_parser(message):
    assert error_messages.parse_message(message) == error_messages._original(message)


def test_installed_sessions_use_it_and_uninstall_restores():
    try:
        error_messages.install()
        assert error_interpolation.parse_message is error_messages.parse_message
    finally:
        error_messages.uninstall()
    assert error_interpolation.parse_message is error_messages._original


def test_a_2_mb_message_without_a_tag_is_parsed():
    # the shape of a "received twice" abort: the request quoted with its tensors' bytes
    message = ("From /job:worker/replica:0/task:0:\nThe same RunGraph (Worker) request was "
               "received twice. send { tensor_content: \"" + "\\004\\000" * 250_000 + "\" }")
    done = []
    t = threading.Thread(target=lambda: done.append(error_messages.parse_message(message)),
                         daemon=True)
    t.start()
    t.join(60)  # TensorFlow's own parser scans this for hours: quadratic in its 2 MB
    assert done == [(message, [], [])]


def test_a_session_error_still_names_the_node():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [None], name="y")
        s = tf.add(x, y, name="the_sum")
    try:
        error_messages.install()
        with tf.compat.v1.Session(graph=g) as sess, pytest.raises(
                tf.errors.InvalidArgumentError, match="the_sum"):
            sess.run(s, {x: [1.0, 2.0], y: [1.0, 2.0, 3.0]})
    finally:
        error_messages.uninstall()
