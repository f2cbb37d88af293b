"""Small builders shared by the tests (no TensorFlow)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace as NS
from typing import Any, Callable

from fastt.ir import Graph, Op, TensorRef, TensorSpec


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
