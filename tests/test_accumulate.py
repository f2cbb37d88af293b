"""Gradient accumulation (``fastt.passes.accumulate``): the batch run as micro-batches in turn
trains like the whole batch (the rewritten graphs run in tensorflow sessions), holds less
memory, and is declined where it cannot run so."""
import numpy as np
import pytest

from fastt import zoo
from fastt.adapters.rewrite import rewrite
from fastt.adapters.tf_import import from_tf_graph
from fastt.errors import Declined, DoesNotFit
from fastt.passes.accumulate import GATE, accumulate
from fastt.passes.allreduce import all_reduce
from fastt.passes.replicas import replica_of
from fastt.sched.search.memory_fit import accumulation_fitting, peak_memory_one_device
from fastt.sched.strategy import Strategy

from tests.equivalence import _reference, _run_with_values

CPU = "/job:localhost/replica:0/task:0/device:CPU:0"


def _accumulated(ir, m, k, lanes=1, ring=False):
    acc = accumulate(ir, k, lanes)
    if ring:  # mirrored weights, the lanes' sums added along a ring
        acc = all_reduce(acc, lanes)
    s = Strategy("accumulation", [CPU], acc, {o.name: CPU for o in acc}, [], 0.0, 0.0, 0.0,
                 replicas=k * lanes, fetches=[m.train_op.name, m.loss.name])
    return rewrite(ir, s, enforce_order=False)


@pytest.mark.parametrize("name,kwargs,tol", [
    ("mlp", {"batch_size": 64, "opt": "momentum"}, 0.0),  # tf.losses' mean: AddN in order
    ("lstm_lm", {"batch_size": 16, "opt": "adam"}, 1e-5),
    ("transformer", {"batch_size": 8, "opt": "sgd"}, 1e-5),
])
def test_accumulated_steps_train_like_the_whole_batch(name, kwargs, tol):
    m = zoo.build(name, **kwargs)
    ir = from_tf_graph(m.graph)
    want = _reference(m, ir, 1)
    # (2, 2): two replicas accumulating two micro-batches each, summed on one device or
    # along a ring
    for k, lanes, ring in ((2, 1, False), (4, 1, False), (2, 2, False), (2, 2, True)):
        got = _run_with_values(_accumulated(ir, m, k, lanes, ring), m, ir, 1)
        if tol == 0.0 and k * lanes == 2:  # two partial gradients: nothing to reassociate
            np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(got[0], want[0], rtol=max(tol, 1e-6), atol=1e-7,
                                   err_msg=f"{name}, {k} micro-batches x {lanes}: losses")
        for a, b in zip(got[1], want[1]):
            np.testing.assert_allclose(a, b, rtol=max(tol, 1e-5), atol=1e-6)


def test_micro_batches_run_in_turn_and_hold_less():
    m = zoo.build("mlp", batch_size=4096, hidden=(1024, 1024))
    step = from_tf_graph(m.graph).fan_in([m.train_op.name, m.loss.name])
    whole = peak_memory_one_device(step)
    peaks = []
    for k in (2, 4):
        acc = accumulate(step, k)
        first = [op for op in acc if replica_of(op) == 1 and not any(
            replica_of(acc[s]) == 1 for s in acc.predecessors(op.name))]
        assert first and all(f"{GATE}0" in op.control_inputs for op in first)
        gate = acc[f"{GATE}0"]
        assert gate.control_inputs and all(replica_of(acc[c]) == 0 for c in gate.control_inputs)
        peaks.append(peak_memory_one_device(acc))
    # activations dominate: each halving of the micro-batch saves a good share
    assert peaks[0] < 0.75 * whole and peaks[1] < 0.85 * peaks[0], (whole, peaks)
    fit = accumulation_fitting(step, (peaks[0] + peaks[1]) / 2)
    assert fit.micro_batches in (3, 4) and fit.peak <= (peaks[0] + peaks[1]) / 2
    with pytest.raises(DoesNotFit, match="MiB over"):
        accumulation_fitting(step, 4 * 2 ** 20)  # less than the variables hold


def test_batch_norm_in_training_is_declined_with_the_op_named():
    m = zoo.build("small_cnn", batch_size=8, batch_norm=True)
    ir = from_tf_graph(m.graph)
    with pytest.raises(Declined, match="batch norm in training .*FusedBatchNorm"):
        accumulate(ir, 2)


def test_lanes_run_their_micro_batches_in_turn_and_sum_their_own():
    m = zoo.build("mlp", batch_size=64)
    step = from_tf_graph(m.graph).fan_in([m.train_op.name, m.loss.name])
    acc = accumulate(step, 3, lanes=2)  # parts 0..5, lane k % 2: the replica
    waited = 0
    for op in acc:
        tail = op.name.rsplit("/part", 1)
        gates = [c for c in op.control_inputs if c.startswith(GATE)]
        if len(tail) == 2 and tail[1].isdigit() and gates:  # part k waits for k - 2
            k = int(tail[1])
            assert gates == [f"{GATE}{k - 2}"] and replica_of(op) == k % 2
            waited += 1
    assert waited
    sums = [op for op in acc if "/fastt_sum" in op.name]
    assert sums and all(replica_of(acc[r.op]) == replica_of(op)
                        for op in sums for r in op.inputs)
    joins = [op for op in acc if op.type == "AddN" and replica_of(op) is None and
             all("/fastt_sum" in r.op for r in op.inputs)]
    assert joins and all(len(op.inputs) == 2 for op in joins)  # the two lanes' sums
