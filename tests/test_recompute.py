"""Recomputation (``fastt.passes.recompute``): the forward activations the backward pass reads,
computed again from checkpoints, train bit for bit like the original (the rewritten graphs run
in tensorflow sessions), seeded random ops drawing alike; the memory model's peak falls; and
``fit_step`` chooses accumulation or recomputation by what fits."""
import numpy as np
import pytest

from fastt import zoo
from fastt.adapters.rewrite import rewrite
from fastt.adapters.tf_import import from_tf_graph
from fastt.errors import DoesNotFit
from fastt.costs.source import StaticCosts
from fastt.errors import FasttError
from fastt.passes.recompute import (COPY, activations, cut_points, forward_ops, gradient_of,
                                    recompute)
from fastt.sched.search.fitted_layouts import (accumulated_layout, fitted_layout,
                                               layout_step_time,
                                               recomputed_layout)
from fastt.sched.search.memory_fit import data_parallel_peaks, peak_memory_one_device
from fastt.sched.search.planning import Planning
from fastt.sched.search.step_fitting import (fit_step, recomputation_fitting, recomputed,
                                             micro_batches_of, recomputed_ops)
from fastt.sched.sim.device_spec import parse
from fastt.sched.sim.problem import Device
from fastt.sched.strategy import Strategy, plan

from tests.equivalence import _reference, _run_with_values

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1
CPU = "/job:localhost/replica:0/task:0/device:CPU:0"


def _run(ir, m, g):
    s = Strategy("memory-fit", [CPU], g, {o.name: CPU for o in g}, [], 0.0, 0.0, 0.0,
                 fetches=[m.train_op.name, m.loss.name])
    return _run_with_values(rewrite(ir, s, enforce_order=False), m, ir, 1)


def _same(got, want, tol):
    if tol == 0.0:
        np.testing.assert_array_equal(got[0], want[0])
        for a, b in zip(got[1], want[1]):
            np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_allclose(got[0], want[0], rtol=tol, atol=1e-7)
        for a, b in zip(got[1], want[1]):
            np.testing.assert_allclose(a, b, rtol=tol, atol=1e-6)


@pytest.mark.parametrize("name,kwargs,tol", [
    ("mlp", {"batch_size": 64, "hidden": (128, 128, 128), "opt": "momentum"}, 0.0),
    ("small_cnn", {"batch_size": 8, "batch_norm": True}, 0.0),
    ("lstm_lm", {"batch_size": 16, "opt": "adam"}, 0.0),
    # an AddN of the same gradients may sum in another order once its inputs come later
    ("transformer", {"batch_size": 8, "opt": "sgd"}, 1e-6),
])
def test_recomputed_steps_train_like_the_original(name, kwargs, tol):
    m = zoo.build(name, **kwargs)
    ir = from_tf_graph(m.graph)
    want = _reference(m, ir, 1)
    acts = activations(ir)
    # every other activation kept; none; every cut point (what the planner tries first, here
    # with no output small enough to be kept as it is)
    for g in (recompute(ir, acts[1::2]), recompute(ir, []), recompute(ir, cut_points(ir, 0))):
        assert any(n.startswith(COPY) for n in g.names)
        _same(_run(ir, m, g), want, tol)


def test_the_copies_wait_for_the_backward_pass_and_the_peak_falls():
    m = zoo.build("mlp", batch_size=4096, hidden=(1024,) * 4)
    step = from_tf_graph(m.graph).fan_in([m.train_op.name, m.loss.name])
    g = recompute(step, activations(step)[1::2])
    copies = [g[n] for n in g.names if n.startswith(COPY)]
    roots = [c for c in copies if not any(i.op.startswith(COPY) for i in c.inputs)]
    assert roots and all(any(gradient_of(w) is not None for w in r.control_inputs)
                         for r in roots if r.meta.origin.startswith("fc"))
    forward = set(forward_ops(step))
    for n in g.names:  # the gradient ops read copies, never a recomputed original
        if gradient_of(n) is not None:
            assert not any(i.op in forward and COPY + i.op in g for i in g[n].inputs)
    assert peak_memory_one_device(g) < 0.75 * peak_memory_one_device(step)


def _dropout_mlp(seed):
    g = tf.Graph()
    with g.as_default():
        if seed is not None:
            tf1.set_random_seed(seed)
        x = tf1.placeholder(tf.float32, [32, 16], name="x")
        y = tf1.placeholder(tf.int32, [32], name="y")
        h = x
        for k in range(3):
            w = tf1.get_variable(f"w{k}", [16, 16], initializer=tf1.glorot_uniform_initializer(k))
            h = tf1.nn.dropout(tf.nn.relu(tf.matmul(h, w)), rate=0.3)
        loss = tf1.losses.sparse_softmax_cross_entropy(y, h)
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
        init = tf1.global_variables_initializer()
    rng = np.random.RandomState(0)
    return zoo.TrainingGraph("dropout_mlp", g, loss, train, init,
                             {"x": rng.rand(32, 16).astype(np.float32),
                              "y": rng.randint(0, 16, 32).astype(np.int32)})


def test_seeded_random_ops_are_recomputed_and_draw_alike_unseeded_ones_are_kept():
    m = _dropout_mlp(seed=7)
    ir = from_tf_graph(m.graph)
    g = recompute(ir, [])
    drawn = [g[n] for n in g.names if n.startswith(COPY) and g[n].type == "RandomUniform"]
    assert len(drawn) == 3  # each layer's mask drawn again
    _same(_run(ir, m, g), _reference(m, ir, 1), 0.0)
    unseeded = from_tf_graph(_dropout_mlp(seed=None).graph)
    g = recompute(unseeded, [])
    assert not [n for n in g.names if n.startswith(COPY) and g[n].type == "RandomUniform"]
    assert any(n.startswith(COPY) for n in g.names)  # the rest still recomputed


def test_fit_step_accumulates_or_recomputes_where_batch_norm_forbids_accumulation():
    mlp = zoo.build("mlp", batch_size=4096, hidden=(1024,) * 4)
    step = from_tf_graph(mlp.graph).fan_in([mlp.train_op.name, mlp.loss.name])
    whole = peak_memory_one_device(step)
    fit = fit_step(step, 0.7 * whole)
    assert fit.micro_batches > 1 and fit.recomputed == 0 and fit.peak <= 0.7 * whole
    assert "micro-batches in turn" in fit.note
    cnn = zoo.build("small_cnn", batch_size=64, batch_norm=True)
    step = from_tf_graph(cnn.graph).fan_in([cnn.train_op.name, cnn.loss.name])
    whole = peak_memory_one_device(step)
    fit = fit_step(step, 0.85 * whole)
    assert fit.micro_batches == 1 and fit.recomputed > 0 and fit.peak <= 0.85 * whole
    assert "forward ops recomputed in the backward pass" in fit.note
    with pytest.raises(DoesNotFit, match="batch norm in training.*no recomputation fits "
                                         r"[\d.]+ MiB; the least, [\d.]+ MiB, is"):
        fit_step(step, 0.3 * whole)
    least = recomputation_fitting(step, whole).peak
    assert least <= whole


def test_cut_points_are_the_activations_no_forward_edge_jumps_over():
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [512, 64], name="x")  # 128 KiB a tensor
        dense = [tf1.get_variable(f"w{k}", [64, 64]) for k in range(3)]
        r1 = tf.nn.relu(tf.matmul(x, dense[0]), name="r1")
        r2 = tf.nn.relu(tf.matmul(r1, dense[1]), name="r2")
        s = tf.add(r1, r2, name="residual")  # r1 read past r2: r2 is no cut point
        loss = tf.reduce_mean(tf.square(tf.matmul(s, dense[2])), name="loss")
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    ir = from_tf_graph(g).fan_in([train.name])
    cuts = cut_points(ir)
    assert "r1" in cuts and "residual" in cuts and "r2" not in cuts
    forward = forward_ops(ir)
    pos = {n: i for i, n in enumerate(forward)}
    for c in cuts:  # nothing recomputable before a cut point is read after it
        assert not [n for n in forward[:pos[c]] if ir[n].type in ("MatMul", "Relu") and
                    any(pos.get(t, -1) > pos[c] for t in ir.successors(n))]


def _memory_devices(k, memory):
    ds = parse(f"{k}xV100")
    ds.devices = [Device(d.name, memory) for d in ds.devices]
    return ds


def test_data_parallelism_accumulates_or_recomputes_where_its_replicas_do_not_fit():
    m = zoo.build("mlp", batch_size=4096, hidden=(1024,) * 4)
    step = from_tf_graph(m.graph).fan_in([m.train_op.name])
    roomy = _memory_devices(2, float("inf"))
    costs = StaticCosts({o.name: 1e-4 for o in step}, roomy)
    assert plan(step, roomy.devices, costs, "data-parallel").micro_batches == 1
    plain = max(data_parallel_peaks(step, _memory_devices(2, 1e15).devices)[1])
    tight = _memory_devices(2, 0.9 * plain)
    held = data_parallel_peaks(step, tight.devices)[1]
    assert max(held) > tight.devices[0].memory  # as it is, it would not fit
    for layout in ("data-parallel", "data-parallel-ps"):
        # both fit: micro-batches (nothing recomputed) and recomputation (one batch); the
        # layout keeps the one with the shorter simulated step, and the plan runs it
        shared = Planning(step, tight.devices, costs)
        peaks = data_parallel_peaks(step, tight.devices, layout == "data-parallel")[1]
        acc = accumulated_layout(shared, layout, peaks)
        rec = recomputed_layout(shared, layout, peaks)
        assert micro_batches_of(acc, 2) > 1 and recomputed_ops(acc) == 0
        assert micro_batches_of(rec, 2) == 1 and recomputed_ops(rec) > 0
        faster = min((acc, rec), key=lambda g: layout_step_time(shared, layout, g))
        chosen = fitted_layout(shared, layout, peaks)
        assert (micro_batches_of(chosen, 2), recomputed_ops(chosen)) == \
            (micro_batches_of(faster, 2), recomputed_ops(faster))
        s = plan(step, tight.devices, costs, layout)
        assert s.replicas == 2 and s.micro_batches == micro_batches_of(faster, 2)
        assert s.recomputed == recomputed_ops(faster, step)
        assert s.to_dict()["micro_batches"] == s.micro_batches
        assert s.to_dict()["recomputed_ops"] == s.recomputed
    with pytest.raises(FasttError, match=r"with its gradients accumulated the fullest still "
                                         r"needs [\d.]+ MiB more"):
        plan(step, _memory_devices(2, 0.3 * plain).devices, costs, "data-parallel")
    # batch norm in training: micro-batches cannot run in turn, activations are recomputed
    cnn = zoo.build("small_cnn", batch_size=256, batch_norm=True)
    step = from_tf_graph(cnn.graph).fan_in([cnn.train_op.name])
    plain = max(data_parallel_peaks(step, _memory_devices(2, 1e15).devices)[1])
    tight = _memory_devices(2, 0.95 * plain)
    s = plan(step, tight.devices, StaticCosts({o.name: 1e-4 for o in step}, roomy),
             "data-parallel")
    assert s.recomputed > 0 and s.micro_batches == 1 and "recomputed_ops" in s.to_dict()
    # counted as the model graph's ops, not as the replicas' parts and batch norms' helpers
    assert s.recomputed in {recomputed_ops(g) for g in recomputed(step)}
