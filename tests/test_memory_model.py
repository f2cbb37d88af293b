"""The one-device memory model: TensorFlow's executor order of ops, reads of a variable that
share its buffer until an update copies it, and the BFC allocator's chunks (no TensorFlow)."""
import random

import pytest

from fastt.costs.bfc import BFC, peak_bytes_in_use
from fastt.ir import Graph, Op, TensorSpec
from fastt.sched.search.memory_fit import (one_device_problem, peak_in_order,
                                           peak_memory_one_device, variable_access)
from fastt.sched.sim.schedule import executor_order
from fastt.sched.sim.simulate import simulate
from tests.helpers import op

BIG = 1000  # float32 elements: 4000 bytes


def order_of(g: Graph, gpu: bool = False) -> list[str]:
    p = one_device_problem(g)
    inline = [gpu or g[n].type in ("Identity", "Const", "ReadVariableOp", "VarHandleOp")
              for n in p.names]
    return [p.names[i] for i in executor_order(p, inline)]


def test_the_last_expensive_op_made_ready_runs_on_and_the_others_wait_newest_first():
    g = Graph([op("x", "Const"), op("s", "Relu", ["x"]), op("a", "Relu", ["s"]),
               op("c", "Identity", ["s"]), op("b", "Relu", ["s"]), op("b1", "Relu", ["b"]),
               op("b2", "Relu", ["b1"]), op("a1", "Relu", ["a"])])
    # s makes a, c and b ready: c (inexpensive) first, then b's chain, then a's
    assert order_of(g) == ["x", "s", "c", "b", "b1", "b2", "a", "a1"]
    # on a GPU every kernel is inexpensive: ops run in the order they become ready
    assert order_of(g, gpu=True) == ["x", "s", "a", "c", "b", "a1", "b1", "b2"]


def test_inexpensive_roots_run_before_any_expensive_op():
    g = Graph([op("x", "Placeholder"), op("k", "Const"), op("y", "Relu", ["x"]),
               op("z", "Mul", ["y", "k"])])
    assert order_of(g) == ["k", "x", "y", "z"]


def test_a_recurrent_backward_pass_finishes_the_top_layer_before_the_one_below():
    """Two layers over three steps, backward: the top layer's gradient at each step feeds the
    lower layer's same step and then (made later, as tf.gradients makes them) the top layer's
    previous step. The top layer's chain runs to its end before the lower layer starts."""
    ops = [op("loss", "Const")]
    for t in (2, 1, 0):
        ops.append(op(f"top{t}", "MatMul", [f"top{t + 1}" if t < 2 else "loss"]))
        ops.append(op(f"low{t}", "MatMul", [f"top{t}"] + ([f"low{t + 1}"] if t < 2 else [])))
    assert order_of(Graph(ops)) == ["loss", "top2", "top1", "top0", "low2", "low1", "low0"]


def _random_graph(rnd: random.Random) -> Graph:
    ops = [op("x", "Placeholder", out=((rnd.randint(1, 50),),))]
    for k in range(1, rnd.randint(2, 60)):
        earlier = [o.name for o in ops]
        ins = rnd.sample(earlier, rnd.randint(1, min(3, len(earlier))))
        ops.append(op(f"op{k}", rnd.choice(["Add", "Identity", "Mul"]), ins,
                      out=((rnd.randint(1, 50),),)))
    return Graph(ops)


def test_the_peak_in_an_order_is_the_simulators_peak_in_that_order():
    rnd = random.Random(7)
    for _ in range(40):
        g = _random_graph(rnd)
        p = one_device_problem(g)
        order = executor_order(p, [rnd.random() < 0.5 for _ in range(p.n)])
        assert peak_in_order(p, order) == pytest.approx(
            simulate(p, [0] * p.n, [order]).peak_memory[0])


def _variable_graph(update_after: str) -> Graph:
    """A variable (4000 bytes) read by ``r``; ``early`` and ``late`` use the read, the update
    ``u`` of the variable waits for ``update_after``."""
    var = Op("v", "VarHandleOp", outputs=(TensorSpec("resource", ()),), is_variable=True,
             attrs={"shape": [BIG], "dtype": "float32"})
    big = ((BIG,),)
    return Graph([
        var, op("g", "Placeholder", out=big), op("r", "ReadVariableOp", ["v"], out=big),
        op("early", "Mul", ["r", "g"], out=((1,),)),
        op("u", "ResourceApplyGradientDescent", ["v", "g"], control=[update_after], out=(),
           stateful=True),
        op("late", "Mul", ["r", "early"], control=["early"], out=((1,),)),
        op("end", "NoOp", control=["u", "late"], out=())])


def test_a_read_shares_its_variables_buffer_until_an_update_copies_it():
    done_first = _variable_graph(update_after="late")  # the read is done with: no copy
    p = one_device_problem(done_first)
    reads = variable_access(done_first, p)
    assert {p.names[i]: [p.names[w] for w in ws] for i, ws in reads.views.items()} == \
        {"r": ["u"]}
    assert reads.copies == {}
    order = [p.index[n] for n in ("v", "g", "r", "early", "late", "u", "end")]
    assert peak_in_order(p, order, reads) == pytest.approx(8000, abs=16)  # v and g
    assert peak_in_order(p, order) == pytest.approx(12000, abs=16)  # the read a copy
    # the update runs while the read is needed: the read keeps the old buffer meanwhile
    copied = [p.index[n] for n in ("v", "g", "r", "early", "u", "late", "end")]
    assert peak_in_order(p, copied, reads) == pytest.approx(12000, abs=16)


def test_the_one_device_peak_counts_reads_as_views_in_the_allocators_chunks():
    g = _variable_graph(update_after="late")
    # v and g (4000 bytes, chunks of 4096) and early's one number (a chunk of 256)
    assert peak_memory_one_device(g) == 2 * 4096 + 256


MiB = 2 ** 20


def test_the_allocator_rounds_to_256_bytes_and_hands_out_a_chunk_it_would_not_split():
    bfc = BFC()
    a = bfc.allocate(1000)
    assert bfc.in_use == 1024
    bfc.release(a)
    # the 2 MiB region merged back whole: a 1.5 MiB request gets all of it (not twice the
    # request, and less than 128 MiB would be wasted)
    bfc.allocate(1.5 * MiB)
    assert bfc.in_use == 2 * MiB
    # a request of a quarter of a free chunk splits it
    bfc2 = BFC()
    bfc2.allocate(0.5 * MiB)
    assert bfc2.in_use == 0.5 * MiB


def test_freed_neighbours_merge_and_regions_double():
    bfc = BFC()
    x, y, z = (bfc.allocate(0.5 * MiB) for _ in range(3))
    bfc.release(x)
    bfc.release(z)
    bfc.release(y)  # merges with both: the region is one free chunk again
    assert bfc.free == [(2 * MiB, 0)]
    bfc.allocate(3 * MiB)  # no chunk holds it: a new region, twice the first
    assert bfc.end > 4 * MiB and bfc.in_use == 4 * MiB


def test_a_step_that_frees_and_reallocates_keeps_the_same_peak_each_step():
    tensors = [(0, 2, 3 * MiB), (1, 3, 1 * MiB), (2, 4, 3 * MiB)]
    assert peak_bytes_in_use([MiB], tensors, steps=1) == peak_bytes_in_use([MiB], tensors)


def test_a_write_that_gives_a_variable_a_new_buffer_holds_both_while_it_runs():
    # a 1 MiB variable; at time 1 a write gives it a new buffer (both held), at 2 the old
    # one is freed
    assert peak_bytes_in_use([MiB], [], swaps=[(1, 0)]) == 2 * MiB
    # with a 0.5 MiB tensor live over [0, 3): the first step's new buffer comes from a second
    # region (2.5 MiB in use); in the next, the first region is free again, the tensor takes
    # its first 0.5 MiB and the new buffer the whole 1.5 MiB chunk beside it, not split
    # (less than twice the request): 0.5 + 1.5 + the variable's 1 MiB
    tensors = [(0, 3, 0.5 * MiB)]
    assert peak_bytes_in_use([MiB], tensors, swaps=[(1, 0)], steps=1) == 2.5 * MiB
    assert peak_bytes_in_use([MiB], tensors, swaps=[(1, 0)], steps=2) == 3 * MiB


def test_a_dense_write_of_a_sparsely_accessed_variable_copies_it():
    var = Op("emb", "VarHandleOp", outputs=(TensorSpec("resource", ()),), is_variable=True,
             attrs={"shape": [BIG], "dtype": "float32"})
    g = Graph([var, op("ids", "Placeholder", out=((4,),), dtype="int32"),
               op("rows", "ResourceGather", ["emb", "ids"], out=((4,),)),
               op("r", "ReadVariableOp", ["emb"], out=((BIG,),)),
               op("w", "AssignVariableOp", ["emb", "r"], control=["rows"], out=(),
                  stateful=True)])
    p = one_device_problem(g)
    access = variable_access(g, p)
    assert access.views == {}  # copy-on-read: the read is a copy
    assert {p.names[w]: p.names[v] for w, v in access.copies.items()} == {"w": "emb"}
