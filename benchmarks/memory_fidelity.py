"""The memory model against TensorFlow's own allocator: the peak of live bytes that fastt
predicts for a training step on one device, next to the peak that TensorFlow's BFC allocator
(the allocator of its GPUs, here made the CPU's) reports for the same step.

    python benchmarks/memory_fidelity.py [--cases NAME ...] [--out benchmarks/results]

Each case runs in a process of its own (the allocator's peak is per process): two warm-up
steps, then one traced step whose node statistics carry the allocator's bytes in use; the
predicted peak is ``fastt.sched.search.memory_fit.peak_memory_one_device`` of the step's ops (the
training step's fan-in, as the planner sees it). Ops run one at a time
(``inter_op_parallelism_threads=1``), as the model assumes. Writes memory_fidelity.json and
memory_fidelity.md.

``--diagnose`` also measures each case with grappler off (TensorFlow's graph as built, so that
its ops are the model's) and replays the model in the order TensorFlow ran that step (the
trace's start times; an op the trace does not list runs as soon as it is ready), live bytes
summed without the allocator's chunks, once with every read a copy and once with reads sharing
their variable's buffer as the model counts them: what the model's error owes to its order of
ops, and to its reads.

This is what the memory-driven plans rest on (issue [search], item 4): BERT-large at sequence
length 64 and batch 24 is what each of two devices holds under data parallelism at a global
batch of 48.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import machine, write_json  # noqa: E402

MiB = 2 ** 20
BERT_SMALL = {"layers": 2, "d_model": 256, "heads": 4, "d_ff": 1024, "vocab": 1000}
# name -> (zoo model, its arguments, batch sizes)
CASES: dict[str, tuple[str, dict, tuple[int, ...]]] = {
    "bert_small": ("bert", BERT_SMALL, (8, 32)),
    "bert_large_2_layers": ("bert", {"layers": 2, "seq_len": 64}, (8, 32)),
    "bert_large": ("bert", {"layers": 24, "seq_len": 64}, (8, 24)),
    "alexnet": ("alexnet_v2", {"image_size": 224}, (32, 128)),
    "lstm_lm": ("lstm_lm", {"layers": 2, "hidden": 1024, "seq_len": 20, "vocab": 10000},
                (16, 64)),
    "resnet_v2_50": ("resnet_v2_50", {"image_size": 224}, (8, 32)),
    "vgg_16": ("vgg_16", {"image_size": 224}, (8, 32)),
    "transformer": ("transformer", {"layers": 6, "d_model": 512, "heads": 8, "d_ff": 2048,
                                    "seq_len": 64, "vocab": 8000}, (8, 32)),
    "gnmt": ("gnmt", {"layers": 2, "hidden": 512, "src_len": 20, "tgt_len": 20,
                      "src_vocab": 8000, "tgt_vocab": 8000}, (16, 64)),
}


# The step as fastt runs it where memory rules: name -> (a case above, how its step is
# rewritten: "accumulate" into k micro-batches, "recompute" from every k-th cut point,
# "data-parallel" over k logical CPU devices, which share the process's one allocator; batches)
REWRITTEN: dict[str, tuple[str, tuple[str, int], tuple[int, ...]]] = {
    "bert_small+accumulate4": ("bert_small", ("accumulate", 4), (32,)),
    "lstm_lm+accumulate4": ("lstm_lm", ("accumulate", 4), (64,)),
    "gnmt+accumulate4": ("gnmt", ("accumulate", 4), (64,)),
    "transformer+recompute2": ("transformer", ("recompute", 2), (32,)),
    "resnet_v2_50+recompute2": ("resnet_v2_50", ("recompute", 2), (32,)),
    "vgg_16+recompute2": ("vgg_16", ("recompute", 2), (8,)),
    "alexnet+data-parallel2": ("alexnet", ("data-parallel", 2), (128,)),
    "bert_small+data-parallel2": ("bert_small", ("data-parallel", 2), (32,)),
}


def rewritten(ir: Any, step: Any, how: tuple[str, int], fetches: list[str]) -> Any:
    """``step`` of ``ir`` rewritten ``how`` (``REWRITTEN``; recomputation from every k-th cut
    point, as the planner recomputes) as a strategy on CPU devices."""
    from fastt.passes.accumulate import accumulate
    from fastt.passes.data_parallel import data_parallel
    from fastt.passes.recompute import cut_points, small_ops
    from fastt.passes.replicas import replica_of
    from fastt.sched.search.step_fitting import recomputed_at, recomputed_ops
    from fastt.sched.strategy import Strategy
    kind, k = how
    cpu = "/job:localhost/replica:0/task:0/device:CPU:{}"
    if kind == "accumulate":
        g, devices = accumulate(step, k), 1
    elif kind == "recompute":
        g, devices = recomputed_at(step, k, cut_points(step), small_ops(step)), 1
    elif kind == "data-parallel":
        g, devices = data_parallel(step, k), k
    else:
        raise SystemExit(f"unknown rewrite {kind!r}")
    placement = {op.name: cpu.format((replica_of(op) or 0) if devices > 1 else 0) for op in g}
    return Strategy(kind, [cpu.format(d) for d in range(devices)], g, placement, [], 0.0, 0.0,
                    0.0, replicas=k if kind == "data-parallel" else 1, fetches=fetches,
                    recomputed=recomputed_ops(g, step),
                    micro_batches=k if kind == "accumulate" else 1)


def measure(zoo_name: str, kwargs: dict, batch: int, grappler: bool = True,
            how: tuple[str, int] | None = None) -> dict:
    """One case in this process: the predicted and the allocator's peak, in bytes; with
    grappler off, also the model replayed in the order TensorFlow ran the step; ``how``: the
    step rewritten so (``rewritten``)."""
    import tensorflow as tf

    from fastt import zoo
    from fastt.adapters import tf_import
    from fastt.adapters.rewrite import keep_fit, rewrite
    from fastt.adapters.runner import traced_run
    from fastt.sched.search.memory_fit import peak_memory_one_device
    tf.compat.v1.disable_eager_execution()
    built = zoo.build(zoo_name, batch_size=batch, **kwargs)
    ir = tf_import.from_tf_graph(built.graph, name=zoo_name)
    step = ir.fan_in([built.train_op.name])
    graph, train, init, feed, devices = built.graph, built.train_op.name, built.init.name, \
        built.feed_dict(), 1
    strategy = None
    if how is not None:
        strategy = rewritten(ir, step, how, [train])
        gd, step, devices = rewrite(ir, strategy), strategy.graph, len(strategy.devices)
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.import_graph_def(gd, name="")
        feed = {graph.get_tensor_by_name(k + ":0"): v for k, v in built.feeds.items()}
    predicted = peak_memory_one_device(step)
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1,
                                      intra_op_parallelism_threads=os.cpu_count() or 1,
                                      device_count={"CPU": devices})
    config.graph_options.rewrite_options.disable_meta_optimizer = not grappler
    keep_fit(config, strategy)  # as the plugin runs a fitted step
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        sess.run(init)
        for _ in range(2):
            sess.run(train, feed_dict=feed)
        meta = traced_run(sess, train, feed)[1]
    peaks: dict[str, int] = {}
    started: dict[str, int] = {}
    for dev in meta.step_stats.dev_stats:
        for ns in dev.node_stats:
            started.setdefault(ns.node_name, ns.all_start_micros)
            for m in ns.memory:
                peaks[m.allocator_name] = max(peaks.get(m.allocator_name, 0), m.peak_bytes,
                                              m.allocator_bytes_in_use)
    bfc = {k: v for k, v in peaks.items() if "bfc" in k}
    if not bfc:
        raise SystemExit(f"no BFC allocator in the trace ({sorted(peaks)}): run through "
                         "run_case, which sets TF_CPU_ALLOCATOR_USE_BFC before TensorFlow starts")
    out = {"ops": len(step), "predicted_bytes": predicted, "measured_bytes": max(bfc.values())}
    if not grappler:
        out |= {"in_tf_order_bytes": in_order(step, started),
                "in_tf_order_reads_as_views_bytes": in_order(step, started, views=True)}
    return out


def in_order(step: Any, started: dict[str, int], views: bool = False) -> float:
    """The model's peak of ``step`` on one device, its ops run in the order of ``started``
    (op -> start in TensorFlow's trace; an op it does not list, at the latest start of its
    inputs: once ready); with ``views``, reads of variables share the variable's buffer as
    the model counts them (``memory_fit.variable_access``), else each is a copy."""
    from fastt.sched.search.memory_fit import one_device_problem, peak_in_order, variable_access
    from fastt.sched.sim.schedule import by_start
    p = one_device_problem(step)
    start = [0.0] * p.n
    for i in p.topo:
        start[i] = float(started.get(p.names[i], max((start[m] for m, _ in p.preds[i]),
                                                     default=0.0)))
    return peak_in_order(p, by_start(p, start), variable_access(step, p) if views else None)


def _one(name: str, batch: int, grappler: bool = True) -> dict:
    """``measure`` of case ``name`` at ``batch`` in a process of its own."""
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPP_MIN_LOG_LEVEL": "2"}
    cmd = [sys.executable, os.path.abspath(__file__), "--one", name, str(batch)]
    out = subprocess.run(cmd + ([] if grappler else ["--no-grappler"]), capture_output=True,
                         text=True, check=False, env=env)
    if out.returncode:
        raise SystemExit(f"{name} at batch {batch} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _case(name: str) -> tuple[str, dict, tuple[str, int] | None]:
    """Case ``name``'s zoo model, its arguments, and how its step is rewritten (None: as
    built)."""
    if name in REWRITTEN:
        base, how, _ = REWRITTEN[name]
        return CASES[base][0], CASES[base][1], how
    return CASES[name][0], CASES[name][1], None


def batches(name: str) -> tuple[int, ...]:
    return (REWRITTEN[name] if name in REWRITTEN else CASES[name])[2]


def run_case(name: str, batch: int, diagnose: bool = False) -> dict:
    """Case ``name`` at ``batch``; with ``diagnose``, also measured with grappler off and the
    model replayed in TensorFlow's order (module docstring)."""
    zoo_name, kwargs, how = _case(name)
    row = _one(name, batch)
    out = {"case": name, "model": zoo_name, "kwargs": kwargs, "batch": batch,
           "rewrite": list(how) if how else None, **row,
           "error": row["predicted_bytes"] / row["measured_bytes"] - 1}
    if diagnose:
        off = _one(name, batch, grappler=False)
        out["diagnosis"] = {"measured_no_grappler_bytes": off["measured_bytes"],
                            "in_tf_order_bytes": off["in_tf_order_bytes"],
                            "in_tf_order_reads_as_views_bytes":
                                off["in_tf_order_reads_as_views_bytes"]}
    return out


def merged(path: str, rows: list[dict]) -> list[dict]:
    """``rows`` with the rows of the run at ``path`` that they do not measure again (another
    case or batch), in ``CASES``' order."""
    old = json.load(open(path))["rows"] if os.path.exists(path) else []
    new = {(r["case"], r["batch"]) for r in rows}
    order = {k: i for i, k in enumerate((c, b) for c in [*CASES, *REWRITTEN]
                                        for b in batches(c))}
    kept = [r for r in old if (r["case"], r["batch"]) not in new
            and (r["case"], r["batch"]) in order]
    return sorted(kept + rows, key=lambda r: order.get((r["case"], r["batch"]), len(order)))


def markdown(doc: dict, heading: str = "#") -> str:
    """The table of ``memory_fidelity.json`` (also a section of the benchmark report)."""
    rows = doc["rows"]
    errors = [abs(r["error"]) for r in rows]
    lines = [f"{heading} Memory model against TensorFlow's allocator", "",
             f"Machine: {doc['machine']}; {doc['when']}. `python benchmarks/memory_fidelity.py`: "
             "per case, fastt's predicted peak of live bytes for the training step on one "
             "device (`peak_memory_one_device`) and the peak bytes in use that TensorFlow's BFC "
             "allocator (its GPUs' allocator, made the CPU's with "
             "`TF_CPU_ALLOCATOR_USE_BFC=true`) reports in a traced step, ops one at a time. "
             "Error = predicted / measured - 1.", "",
             "| case | batch | ops | predicted (MiB) | measured (MiB) | error |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['batch']} | {r['ops']} | "
                     f"{r['predicted_bytes'] / MiB:.0f} | {r['measured_bytes'] / MiB:.0f} | "
                     f"{100 * r['error']:+.0f}% |")
    if errors:
        models = len({r["case"].split("+")[0] for r in rows})
        rewritten = [abs(r["error"]) for r in rows if r.get("rewrite")]
        lines += ["", f"Median absolute error {100 * statistics.median(errors):.0f}%, worst "
                      f"{100 * max(errors):.0f}% over {len(rows)} rows of {models} models"
                  + (f"; the {len(rewritten)} rows of steps as fastt rewrites them where memory "
                     "rules (`+accumulate<k>`: k micro-batches in turn; `+recompute<k>`: every "
                     "k-th cut point kept, the rest recomputed; both run without grappler, as "
                     "the plugin runs a step fitted to memory; `+data-parallel<k>`: k replicas "
                     "on logical CPU devices sharing the allocator): median "
                     f"{100 * statistics.median(rewritten):.0f}%, worst "
                     f"{100 * max(rewritten):.0f}%" if rewritten else "") + "."]
    diagnosed = [r for r in rows if "diagnosis" in r]
    if diagnosed:
        lines += ["", "Where the error comes from (`--diagnose`): the same step measured with "
                  "grappler off (the graph as built, whose ops are the model's), and the model "
                  "replayed in the order TensorFlow ran that step, as it stands and with each "
                  "`ReadVariableOp` a view of its variable (no bytes of its own). Errors "
                  "against the measurement with grappler off.", "",
                  "| case | batch | measured, grappler off (MiB) | model in TensorFlow's order "
                  "| error | and reads as views | error |", "|---|---:|---:|---:|---:|---:|---:|"]
        for r in diagnosed:
            d = r["diagnosis"]
            m = d["measured_no_grappler_bytes"]
            a, b = d["in_tf_order_bytes"], d["in_tf_order_reads_as_views_bytes"]
            lines.append(f"| {r['case']} | {r['batch']} | {m / MiB:.0f} | {a / MiB:.0f} | "
                         f"{100 * (a / m - 1):+.0f}% | {b / MiB:.0f} | {100 * (b / m - 1):+.0f}% |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", choices=sorted([*CASES, *REWRITTEN]),
                    default=[*CASES, *REWRITTEN])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--diagnose", action="store_true",
                    help="also measure with grappler off and replay the model in "
                         "TensorFlow's order (module docstring)")
    ap.add_argument("--one", nargs=2, metavar=("CASE", "BATCH"), help=argparse.SUPPRESS)
    ap.add_argument("--no-grappler", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        zoo_name, kwargs, how = _case(args.one[0])
        print(json.dumps(measure(zoo_name, kwargs, int(args.one[1]),
                                 grappler=not args.no_grappler, how=how)))
        return
    doc: dict = {"machine": machine(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "rows": []}
    for name in args.cases:
        for batch in batches(name):
            row = run_case(name, batch, args.diagnose)
            print(f"{name} batch {batch}: predicted {row['predicted_bytes'] / MiB:.0f} MiB, "
                  f"measured {row['measured_bytes'] / MiB:.0f} MiB ({100 * row['error']:+.0f}%)",
                  flush=True)
            doc["rows"].append(row)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "memory_fidelity.json")
    doc["rows"] = merged(path, doc["rows"])
    write_json(path, doc)
    with open(os.path.join(args.out, "memory_fidelity.md"), "w", encoding="utf-8") as f:
        f.write(markdown(doc))


if __name__ == "__main__":
    main()
