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
}


def measure(zoo_name: str, kwargs: dict, batch: int) -> dict:
    """One case in this process: the predicted and the allocator's peak, in bytes."""
    import tensorflow as tf

    from fastt import zoo
    from fastt.adapters import tf_import
    from fastt.adapters.runner import traced_run
    from fastt.sched.search.memory_fit import peak_memory_one_device
    tf.compat.v1.disable_eager_execution()
    built = zoo.build(zoo_name, batch_size=batch, **kwargs)
    step = tf_import.from_tf_graph(built.graph, name=zoo_name).fan_in([built.train_op.name])
    predicted = peak_memory_one_device(step)
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1,
                                      intra_op_parallelism_threads=os.cpu_count() or 1)
    with tf.compat.v1.Session(graph=built.graph, config=config) as sess:
        sess.run(built.init)
        feed = built.feed_dict()
        for _ in range(2):
            sess.run(built.train_op, feed_dict=feed)
        meta = traced_run(sess, built.train_op, feed)[1]
    peaks: dict[str, int] = {}
    for dev in meta.step_stats.dev_stats:
        for ns in dev.node_stats:
            for m in ns.memory:
                peaks[m.allocator_name] = max(peaks.get(m.allocator_name, 0), m.peak_bytes,
                                              m.allocator_bytes_in_use)
    bfc = {k: v for k, v in peaks.items() if "bfc" in k}
    if not bfc:
        raise SystemExit(f"no BFC allocator in the trace ({sorted(peaks)}): run through "
                         "run_case, which sets TF_CPU_ALLOCATOR_USE_BFC before TensorFlow starts")
    return {"ops": len(step), "predicted_bytes": predicted, "measured_bytes": max(bfc.values())}


def run_case(name: str, batch: int) -> dict:
    """``measure`` of case ``name`` at ``batch`` in a process of its own."""
    zoo_name, kwargs, _ = CASES[name]
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", name, str(batch)],
                         capture_output=True, text=True, check=False, env=env)
    if out.returncode:
        raise SystemExit(f"{name} at batch {batch} failed:\n{out.stderr[-3000:]}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    return {"case": name, "model": zoo_name, "kwargs": kwargs, "batch": batch, **row,
            "error": row["predicted_bytes"] / row["measured_bytes"] - 1}


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
        lines += ["", f"Median absolute error {100 * statistics.median(errors):.0f}%, worst "
                      f"{100 * max(errors):.0f}% over {len(rows)} cases."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", choices=sorted(CASES), default=list(CASES))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--one", nargs=2, metavar=("CASE", "BATCH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        zoo_name, kwargs, _ = CASES[args.one[0]]
        print(json.dumps(measure(zoo_name, kwargs, int(args.one[1]))))
        return
    doc: dict = {"machine": machine(), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "rows": []}
    for name in args.cases:
        for batch in CASES[name][2]:
            row = run_case(name, batch)
            print(f"{name} batch {batch}: predicted {row['predicted_bytes'] / MiB:.0f} MiB, "
                  f"measured {row['measured_bytes'] / MiB:.0f} MiB ({100 * row['error']:+.0f}%)",
                  flush=True)
            doc["rows"].append(row)
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "memory_fidelity.json"), doc)
    with open(os.path.join(args.out, "memory_fidelity.md"), "w", encoding="utf-8") as f:
        f.write(markdown(doc))


if __name__ == "__main__":
    main()
