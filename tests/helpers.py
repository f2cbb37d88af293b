"""Small builders shared by the tests (no TensorFlow)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace as NS
from typing import Any, Callable

from fastt.costs.source import StaticCosts
from fastt.ir import Graph, Op, TensorRef, TensorSpec
from fastt.sched import Device, Problem


def op(name, type_="Op", inputs=(), control=(), out=((4,),), dtype="float32", **kw):
    """An op with float32 outputs of the given shapes; inputs as 'name' or 'name:i'."""
    refs = []
    for i in inputs:
        n, _, idx = i.partition(":")
        refs.append(TensorRef(n, int(idx or 0)))
    return Op(name=name, type=type_, inputs=tuple(refs), control_inputs=tuple(control),
              outputs=tuple(TensorSpec(dtype, s) for s in out), **kw)


def chain(n: int) -> Graph:
    ops = [op("a0", "Const")] + [op(f"a{i}", "Relu", [f"a{i - 1}"]) for i in range(1, n)]
    return Graph(ops)


def node_stats(name, label_type, start_ns=0, dur_ns=1000, inputs=(), outputs=(), label=None):
    """A duck-typed NodeStats."""
    outs = [NS(slot=i, tensor_description=NS(
        dtype=1, shape=NS(unknown_rank=False, dim=[NS(size=d) for d in shape]),
        allocation_description=NS(requested_bytes=nbytes), HasField=lambda f: True))
        for i, (shape, nbytes) in enumerate(outputs)]
    return NS(node_name=name, op_start_rel_nanos=start_ns, op_end_rel_nanos=start_ns + dur_ns,
              op_start_rel_micros=start_ns // 1000, op_end_rel_micros=(start_ns + dur_ns) // 1000,
              all_end_rel_micros=(start_ns + dur_ns) // 1000,
              all_end_rel_nanos=start_ns + dur_ns, output=outs,
              timeline_label=label or f"{name} = {label_type}({', '.join(inputs)})")


def run_metadata(devs: dict) -> NS:
    """A duck-typed RunMetadata: {device name: [node stats]}."""
    return NS(step_stats=NS(dev_stats=[NS(device=d, node_stats=n) for d, n in devs.items()]))


def equivalence(*args: str) -> str:
    """``python -m tests.equivalence ARGS`` in a process of its own (each builds and drops
    dozens of graphs); its stdout, once it has exited 0."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root, "TF_CPP_MIN_LOG_LEVEL": "2"}
    p = subprocess.run([sys.executable, "-m", "tests.equivalence", *args], cwd=root,
                       env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    return p.stdout


def side_by_side(*calls: Callable[[], Any]) -> list[Any]:
    """Each call's result, the calls run at once in threads (each starts a process of its
    own: on 2 cores two at a time finish sooner than one after the other)."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def training_graph(B=8):
    """x[B,4] -> matmul(w) -> relu -> per-example loss -> mean; dW by transpose_a matmul."""
    return Graph([
        op("x", "Placeholder", out=((B, 4),)),
        op("w", "VarHandleOp", out=((),), dtype="resource", is_variable=True),
        op("w/read", "ReadVariableOp", ["w"], out=((4, 3),)),
        op("h", "MatMul", ["x", "w/read"], out=((B, 3),)),
        op("a", "Relu", ["h"], out=((B, 3),)),
        op("bn", "FusedBatchNormV3", ["a"], out=((B, 3),)),
        op("loss", "Mean", ["bn", "axes"], out=((),)),
        op("axes", "Const", out=((2,),), dtype="int32", attrs={"value": [0, 1]}),
        op("dy", "Mul", ["bn", "a"], out=((B, 3),)),
        op("dh", "ReluGrad", ["dy", "a"], out=((B, 3),)),
        op("dw", "MatMul", ["x", "dh"], out=((4, 3),), attrs={"transpose_a": True}),
        op("shape", "Shape", ["x"], out=((2,),), dtype="int32"),
        op("lr", "Const", out=((),)),
        op("update", "ResourceApplyGradientDescent", ["w", "lr", "dw"], out=()),
    ])


def devs(k, memory=float("inf")):
    return [Device(f"/gpu:{d}", memory) for d in range(k)]


def random_problem(rnd, homogeneous, memory=False, hinged=False):
    n, D = rnd.randint(2, 8), rnd.randint(2, 3)
    edges = [(i, j, rnd.uniform(0, 1e6)) for i in range(n) for j in range(i + 1, n)
             if rnd.random() < 0.35]
    if homogeneous:
        w = [[rnd.uniform(1, 10)] * D for _ in range(n)]
    else:
        w = [[rnd.uniform(1, 10) for _ in range(D)] for _ in range(n)]
    intercept = [[rnd.uniform(0, 2) for _ in range(D)] for _ in range(D)]
    slope = [[rnd.uniform(0, 3e-6) for _ in range(D)] for _ in range(D)]
    mem = [rnd.uniform(1, 10) for _ in range(n)] if memory else None
    cap = sum(mem) / D * 1.3 + max(mem) if memory else float("inf")
    group = list(range(n))
    if memory and n > 3:
        group[n - 1] = group[n - 2] = n - 2  # one colocated pair
    bends = {}
    if hinged:  # links that cost more per byte past a knee (fastt.costs.comm)
        bends = {"knee": [[rnd.uniform(0, 1e6) for _ in range(D)] for _ in range(D)],
                 "extra": [[rnd.uniform(0, 6e-6) for _ in range(D)] for _ in range(D)]}
    return Problem.build(n, edges, w, devs(D, cap), intercept=intercept, slope=slope,
                         mem=mem, group=group, **bends)


def costs(ds, graph):
    """Static op times on ``ds``: 5 ms for a MatMul or ReluGrad, 1 ms for any other op."""
    times = {o.name: 1e-3 * (5 if o.type in ("MatMul", "ReluGrad") else 1) for o in graph}
    return StaticCosts(times, ds)


def momentum_graph(bn_scale=False, B=8, F=64):
    """x[B,F] -> matmul(w) -> relu -> loss; dW by a transposed matmul; Momentum on w (slot
    ``accum``), a global step, a train op waiting for both. With ``bn_scale`` a scale ``g``
    whose gradient comes from an op run on the whole batch (BatchNorm's statistics)."""
    ops = [
        op("x", "Placeholder", out=((B, F),)),
        op("w", "VarHandleOp", out=((),), dtype="resource", is_variable=True,
           attrs={"dtype": "float32", "shape": [F, F]}),
        op("accum", "VarHandleOp", out=((),), dtype="resource", is_variable=True,
           attrs={"dtype": "float32", "shape": [F, F]}),
        op("step", "VarHandleOp", out=((),), dtype="resource", is_variable=True,
           attrs={"dtype": "int64", "shape": []}),
        op("w/read", "ReadVariableOp", ["w"], out=((F, F),), stateful=True),
        op("h", "MatMul", ["x", "w/read"], out=((B, F),)),
        op("a", "Relu", ["h"], out=((B, F),)),
        op("dh", "ReluGrad", ["a", "a"], out=((B, F),)),
        op("dw", "MatMul", ["x", "dh"], out=((F, F),), attrs={"transpose_a": True}),
        op("lr", "Const", out=((),)),
        op("mom", "Const", out=((),)),
        op("update", "ResourceApplyMomentum", ["w", "accum", "lr", "dw", "mom"], out=(),
           stateful=True),
        op("one", "Const", out=((),), dtype="int64"),
        op("inc", "AssignAddVariableOp", ["step", "one"], out=(), stateful=True),
    ]
    updates = ["update", "inc"]
    if bn_scale:
        ops += [
            op("g", "VarHandleOp", out=((),), dtype="resource", is_variable=True,
               attrs={"dtype": "float32", "shape": [F]}),
            op("g/read", "ReadVariableOp", ["g"], out=((F,),), stateful=True),
            op("scaled", "Mul", ["a", "g/read"], out=((B, F),)),  # read by every replica
            # the gradient of BatchNorm's scale, from the whole batch's statistics
            op("dg", "FusedBatchNormGradV3", ["a", "a"], out=((F,),)),
            op("update_g", "ResourceApplyGradientDescent", ["g", "lr", "dg"], out=(),
               stateful=True)]
        updates.append("update_g")
    ops.append(op("train", "NoOp", out=(), control=updates))
    return Graph(ops)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


EXAMPLES = {
    "session_feed_dict.py": None,
    "monitored_tf_data.py": None,
    "keras_fit.py": "tf_keras",
    "slim_train.py": "tf_slim",
}


# Runs short enough for floating-point reassociation to stay within the loss tolerance.
SHORT = {"keras_fit.py": ["--epochs", "6"], "session_feed_dict.py": ["--steps", "60"],
         "monitored_tf_data.py": ["--steps", "80"], "slim_train.py": ["--steps", "60"]}


def example_command(script, tmp_path, fastt, fastt_env=None, extra=()):
    """(argv, env) of an example run with its own output directory; with ``fastt``, the
    plugin on, ``fastt_env`` (default: two logical CPU devices) and dumps in tmp_path/dump;
    ``extra`` arguments override the short run's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTT") and k != "TF_CONFIG"}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    if fastt:  # short runs (80 steps): decisions on 3 settled steps, not 20, at any cost
        env.update(FASTT="1", FASTT_DUMP_DIR=str(tmp_path / "dump"), FASTT_MEASURE_STEPS="3",
                   FASTT_OVERHEAD="off", FASTT_CACHE="0",
                   FASTT_MEASURE_SECONDS="0", FASTT_WARMUP_STEPS="2",
                   **(fastt_env or {"FASTT_DEVICES": "cpu:2"}))
    args = [sys.executable, os.path.join(ROOT, "examples", script), *SHORT[script], *extra]
    if script != "keras_fit.py":
        args += ["--out", str(tmp_path / ("fastt" if fastt else "plain"))]
    return args, env


def run(script, tmp_path, fastt, fastt_env=None, cores=None):
    """Run an example to its end; (final loss, stdout, stderr). ``cores``: pin it to them."""
    args, env = example_command(script, tmp_path, fastt, fastt_env)
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600,
                       preexec_fn=pin)
    assert p.returncode == 0, p.stderr[-3000:]
    loss = float(re.search(r"final loss: (\S+)", p.stdout).group(1))
    return loss, p.stdout, p.stderr
