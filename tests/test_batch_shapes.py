"""Batch dimensions shape inference left unknown, filled from the inputs that carry the batch
(``fastt.passes.batch_shapes``; no TensorFlow)."""
from fastt.ir import Graph, TensorRef
from fastt.passes.batch_shapes import batch_filled
from tests.helpers import op


def test_the_batch_follows_an_if_whose_shapes_were_recorded_unknown():
    g = Graph([
        op("x", "Placeholder", out=((8, 4, 4, 3),)),
        op("gamma", "Const", out=((3,),)),
        op("bn", "If", ["x", "gamma"], out=((None, 4, 4, 3), (3,))),
        op("relu", "Relu", ["bn"], out=((None, 4, 4, 3),)),
        op("flat", "Reshape", ["relu"], out=((None, 48),)),
        op("w", "Const", out=((48, 10),)),
        op("logits", "MatMul", ["flat", "w"], out=((None, 10),)),
        op("scale", "Mul", ["gamma", "gamma"], out=((None,),)),  # reads no batch: left alone
    ])
    filled = batch_filled(g, 8)
    assert filled == {TensorRef("bn", 0): (8, 4, 4, 3), TensorRef("relu", 0): (8, 4, 4, 3),
                      TensorRef("flat", 0): (8, 48), TensorRef("logits", 0): (8, 10)}
    shaped = g.with_output_shapes(filled)
    assert shaped["logits"].outputs[0].nbytes == 8 * 10 * 4


def test_a_reshape_keeps_its_element_count():
    g = Graph([op("x", "Placeholder", out=((8, 6),)),
               op("r", "Reshape", ["x"], out=((None, 4),)),  # 48 elements: 12 rows
               op("bad", "Reshape", ["x"], out=((None, 5),))])  # 48 is not a multiple of 5
    assert batch_filled(g, 8) == {TensorRef("r", 0): (12, 4)}
