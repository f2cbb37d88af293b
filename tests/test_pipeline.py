"""Pipeline stages: PipeDream's partitioner against a brute-force optimum, the layers of a
training graph, and micro-batched pipelines training like the original."""
import math
import itertools
import random

import pytest

from fastt.costs.source import StaticCosts
from fastt.errors import FasttError
from fastt.ir import Graph, Op, TensorRef, TensorSpec
from fastt.sched.sim.device_spec import DeviceSet, parse
from fastt.sched.placers.pipedream import layers
from fastt.sched.placers.stages import Stage, balanced, partition, stage_time
from fastt.sched.sim.problem import Device, Problem
from tests.helpers import equivalence



def brute_force(T, a, w, M, B):
    """The slowest stage of the best pipeline, by trying every cut and every split of the
    machines."""
    N, best = len(T), float("inf")
    for k in range(1, min(N, M) + 1):
        for cuts in itertools.combinations(range(N - 1), k - 1):
            bounds = list(zip((0,) + tuple(c + 1 for c in cuts), cuts + (N - 1,)))
            for reps in itertools.product(range(1, M + 1), repeat=k):
                if sum(reps) != M:
                    continue
                slowest = max(stage_time(sum(T[i:j + 1]), sum(w[i:j + 1]), r, B)
                              for (i, j), r in zip(bounds, reps))
                slowest = max([slowest] + [a[c] / B for c in cuts])
                best = min(best, slowest)
    return best


def value(T, a, w, stages, B):
    return max([stage_time(sum(T[s.first:s.last + 1]), sum(w[s.first:s.last + 1]),
                           s.replicas, B) for s in stages] + [a[s.last] / B for s in stages[:-1]])


@pytest.mark.parametrize("seed", range(60))
def test_the_partition_is_optimal_on_small_chains(seed):
    rnd = random.Random(seed)
    N, M, B = rnd.randint(1, 6), rnd.randint(1, 5), 1e9
    T = [rnd.uniform(0.1, 10) * 1e-3 for _ in range(N)]
    a = [rnd.choice([1e3, 1e6, 5e6, 2e7]) for _ in range(N)]
    w = [rnd.choice([0.0, 1e5, 1e7, 1e8]) for _ in range(N)]
    got, stages = partition(T, a, w, M, B)
    assert got == pytest.approx(brute_force(T, a, w, M, B))
    # the stages are the layers in order, every machine used, and worth what is claimed
    assert stages[0].first == 0 and stages[-1].last == N - 1
    assert all(s.first == t.last + 1 for t, s in zip(stages, stages[1:]))
    assert sum(s.replicas for s in stages) == M
    assert value(T, a, w, stages, B) == pytest.approx(got)


@pytest.mark.parametrize("seed", range(40))
def test_the_balanced_cut_is_optimal_for_its_stage_count(seed):
    rnd = random.Random(100 + seed)
    N, S, r, B = rnd.randint(1, 7), rnd.randint(1, 4), rnd.randint(1, 3), 1e9
    S = min(S, N)
    T = [rnd.uniform(0.1, 10) * 1e-3 for _ in range(N)]
    a = [rnd.choice([1e3, 1e6, 5e6, 2e7]) for _ in range(N)]
    w = [rnd.choice([0.0, 1e5, 1e7, 1e8]) for _ in range(N)]
    best = float("inf")
    for cuts in itertools.combinations(range(N - 1), S - 1):
        stages = [Stage(i, j, r) for i, j in zip((0,) + tuple(c + 1 for c in cuts),
                                                 cuts + (N - 1,))]
        best = min(best, value(T, a, w, stages, B))
    got, stages = balanced(T, a, w, S, r, B)
    assert got == pytest.approx(best) and len(stages) == S
    assert value(T, a, w, stages, B) == pytest.approx(got)


def test_heavy_weights_stay_unreplicated_and_light_compute_is_replicated():
    """A convolutional front (much compute, few weights) and a fully connected back (little
    compute, 400 MB of weights) on 4 devices joined at 1 GB/s: the front is replicated, the
    back is not (its weights would take 1.2 s to synchronise)."""
    B = 1e9
    got, stages = partition([40e-3, 40e-3, 2e-3], [1e6, 1e6, 0.0], [1e6, 1e6, 4e8], 4, B)
    assert stages == [Stage(0, 1, 3), Stage(2, 2, 1)]
    assert got == pytest.approx(80e-3 / 3)


def test_bad_input():
    with pytest.raises(FasttError, match="as many"):
        partition([1.0], [1.0, 2.0], [1.0], 2, 1e9)
    with pytest.raises(FasttError, match="machines >= 1"):
        partition([1.0], [1.0], [1.0], 0, 1e9)


def _op(name, typ="MatMul", inputs=(), variable=False, nbytes=4000):
    return Op(name, typ, inputs=tuple(TensorRef(i, 0) for i in inputs),
              outputs=(TensorSpec("resource" if variable else "float32",
                                  None if variable else (nbytes // 4,)),),
              is_variable=variable, stateful=variable or typ.startswith("Resource"))


def chain(n):
    """n dense layers as tf.gradients and an optimizer build them: layer k reads weight
    w{k}; the backward ops are named after the forward ones; each update writes its
    weight."""
    ops, x = [_op("x", "Placeholder")], "x"
    for k in range(n):
        ops += [_op(f"w{k}", "VarHandleOp", variable=True),
                _op(f"l{k}/read", "ReadVariableOp", [f"w{k}"]),
                _op(f"l{k}/MatMul", "MatMul", [x, f"l{k}/read"])]
        x = f"l{k}/MatMul"
    ops.append(_op("loss", "Sum", [x]))
    g = f"gradients/l{n - 1}/MatMul_grad"
    ops.append(_op("gradients/Fill", "Fill", ["loss"]))
    up = "gradients/Fill"
    for k in reversed(range(n)):
        g = f"gradients/l{k}/MatMul_grad"
        ops += [_op(f"{g}/MatMul", "MatMul", [up, f"l{k}/read"]),
                _op(f"{g}/MatMul_1", "MatMul", [x if k == 0 else f"l{k - 1}/MatMul", up]),
                _op(f"SGD/update_w{k}/ResourceApplyGradientDescent",
                    "ResourceApplyGradientDescent", [f"w{k}", f"{g}/MatMul_1"])]
        up = f"{g}/MatMul"
    return Graph(ops)


def test_layers_follow_the_forward_pass_and_keep_each_layer_with_its_gradient_and_update():
    g = chain(4)
    devs = [Device("/cpu:0")]
    p = Problem.from_graph(g, devs, StaticCosts({op.name: 1e-3 for op in g},
                                                DeviceSet("CPU", devs)))
    layer = dict(zip(p.names, layers(p, g, count=4)))
    forward = [layer[f"l{k}/MatMul"] for k in range(4)]
    assert forward == sorted(forward) and forward[0] == 0 and forward[-1] == 3
    for k in range(4):
        g_ = f"gradients/l{k}/MatMul_grad"
        assert layer[f"{g_}/MatMul"] == layer[f"{g_}/MatMul_1"] == layer[f"l{k}/MatMul"]
        assert layer[f"w{k}"] == layer[f"l{k}/read"] == \
            layer[f"SGD/update_w{k}/ResourceApplyGradientDescent"] == layer[f"l{k}/MatMul"]


def test_micro_batched_pipelines_train_like_the_original():
    """Two-stage pipelines over 2 and 4 micro-batches of an MLP, a CNN without BatchNorm, an
    LSTM language model and a Transformer block, in-process and on a 2-worker cluster, in a
    process of their own (``tests/equivalence.py --pipeline``)."""
    assert equivalence("--pipeline").count("pipelines train as the original") == 4


@pytest.mark.parametrize("seed", range(6))
def test_an_order_that_cannot_beat_the_best_so_far_is_not_returned_and_the_rest_is_unchanged(
        seed):
    """``fastest_order`` with ``beat`` (the caller's best so far) skips the memory checks that
    cannot change the answer: it returns what it returns without ``beat`` when that is
    faster than ``beat``, else None, on random costs, placements and memory limits that make
    some orders misfit."""
    from fastt.errors import DoesNotFit
    from fastt.passes.data_parallel import data_parallel
    from fastt.sched.placers.pipedream import fastest_order
    from fastt.sched.sim.simulate import simulate_fifo
    from tests.helpers import training_graph
    rng = random.Random(seed)
    g = data_parallel(training_graph(B=16), 4)
    ds = parse("2xV100")
    times = {op.name: rng.uniform(1e-4, 1e-3) for op in g}

    def problem(memory):
        devs = [Device(d.name, m) for d, m in zip(ds.devices, memory)]
        return Problem.from_graph(g, devs, StaticCosts(times, DeviceSet("V100", devs, ds.links)))
    free = problem([math.inf] * 2)
    outcomes = set()
    for _ in range(8):
        device = [rng.randrange(2) for _ in range(free.n)]
        peaks = simulate_fifo(free, device).peak_memory
        p = problem([peak * rng.choice((0.5, 0.99, 1.0, 2.0)) for peak in peaks])
        try:
            full = fastest_order(p, g, device, "cut")
        except DoesNotFit:
            full = None
        ends = [full.makespan] if full else []
        for beat in [e * k for e in ends for k in (0.9, 1.0, 1.1)] + [1.0, math.inf]:
            if full is None and beat == math.inf:
                with pytest.raises(DoesNotFit):
                    fastest_order(p, g, device, "cut", beat=beat)
                continue
            got = fastest_order(p, g, device, "cut", beat=beat)
            if full is None or full.makespan >= beat:
                assert got is None
            else:
                assert got is not None and (got.note, got.finish) == (full.note, full.finish)
            outcomes.add((full is None, got is None))
    assert len(outcomes) >= 2  # both a kept answer and a None were met
