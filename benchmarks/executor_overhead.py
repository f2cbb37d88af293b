"""The priority executor's own cost per node, against TensorFlow's default executor.

    python benchmarks/executor_overhead.py [--quick] [--steps N] [--repeats R] [--out DIR]

Graphs of tiny ops (scalar adds, a few hundred nanoseconds of kernel each) on one CPU device,
so that what a step takes is the executor's bookkeeping: a chain (one ready node at a time)
and 16 chains side by side (fan-out: many ready nodes). Every node carries a priority. Blocks
of steps alternate between a session with the default executor and one with fastt's; the
per-node overhead is (priority - default) / nodes, median over the repeats. Writes
executor_overhead.json and executor_overhead.md.
"""
from __future__ import annotations

import os
import platform
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

from benchmarks.common import arguments, block, write_json  # noqa: E402
from tf_patches import priority_executor  # noqa: E402

tf1 = tf.compat.v1
SHAPES = {"chain": (1, 2000), "16 chains": (16, 125)}  # (chains, length): 2,000 adds each


def graph_def(chains: int, length: int) -> tuple[tf1.GraphDef, list[str]]:
    """``chains`` independent chains of ``length`` scalar adds, each node given a priority
    (later in a chain: lower), and the names of the chains' ends."""
    g = tf.Graph()
    ends = []
    with g.as_default():
        x = tf1.placeholder(tf.float32, [], name="x")
        for c in range(chains):
            y = x
            for _ in range(length):
                y = y + 1.0
            ends.append(y.op.name)
    gd = g.as_graph_def()
    for i, node in enumerate(gd.node):
        node.attr[priority_executor.PRIORITY_ATTR].i = len(gd.node) - i
    return gd, ends


def session(gd: tf1.GraphDef, priority: bool) -> tf1.Session:
    cfg = tf1.ConfigProto()
    cfg.graph_options.optimizer_options.opt_level = tf1.OptimizerOptions.L0
    cfg.graph_options.rewrite_options.disable_meta_optimizer = True  # keep every add
    if priority:
        cfg.experimental.executor_type = priority_executor.EXECUTOR_TYPE
    g = tf.Graph()
    with g.as_default():
        tf1.import_graph_def(gd, name="")
    return tf1.Session(graph=g, config=cfg)


def bench(name: str, chains: int, length: int, steps: int, repeats: int) -> dict:
    gd, ends = graph_def(chains, length)
    nodes = chains * length
    runs = {}
    for mode in ("default", "priority"):
        sess = session(gd, mode == "priority")
        fetch = [sess.graph.get_tensor_by_name(e + ":0") for e in ends]
        feed = {sess.graph.get_tensor_by_name("x:0"): 0.0}
        assert sess.run(fetch, feed) == [float(length)] * chains
        runs[mode] = (sess, lambda s=sess, f=fetch, d=feed: s.run(f, d))
        block(runs[mode][1], steps)  # warm up
    times: dict[str, list[float]] = {"default": [], "priority": []}
    for r in range(repeats):
        for mode in (("default", "priority") if r % 2 == 0 else ("priority", "default")):
            times[mode].append(block(runs[mode][1], steps))
    for sess, _ in runs.values():
        sess.close()
    per_node = [(p - d) / nodes for p, d in zip(times["priority"], times["default"])]
    row = {"graph": name, "nodes": nodes,
           "step_s": {m: statistics.median(t) for m, t in times.items()},
           "ratio": statistics.median(p / d for p, d in zip(times["priority"],
                                                              times["default"])),
           "overhead_per_node_us": 1e6 * statistics.median(per_node), "times_s": times}
    print(f"{name:>10}: default {1e3 * row['step_s']['default']:.2f} ms, priority "
          f"{1e3 * row['step_s']['priority']:.2f} ms ({row['ratio']:.3f}x), "
          f"{row['overhead_per_node_us']:+.2f} us per node", flush=True)
    return row


def main() -> None:
    args = arguments(__doc__, steps=20, repeats=15)
    tf1.disable_eager_execution()
    if not priority_executor.load():
        sys.exit("the priority executor is not built; reinstall fastt with a C++ compiler")
    steps, repeats = (5, 3) if args.quick else (args.steps, args.repeats)
    rows = [bench(n, c, length, steps, repeats) for n, (c, length) in SHAPES.items()]
    os.makedirs(args.out, exist_ok=True)
    meta = {"python": platform.python_version(), "tensorflow": tf.__version__,
            "cpus": os.cpu_count(), "load_avg": os.getloadavg(), "steps_per_block": steps,
            "repeats": repeats, "quick": args.quick}
    write_json(os.path.join(args.out, "executor_overhead.json"), {"meta": meta, "rows": rows})
    lines = ["# The priority executor's cost per node", "",
             f"2,000 scalar adds per step on one CPU device; median over {repeats} alternating "
             f"blocks of {steps} steps. TensorFlow {tf.__version__}, {os.cpu_count()} cores, "
             f"load average {os.getloadavg()[0]:.2f} at the end.", "",
             "| graph | nodes | default (ms) | priority (ms) | ratio | per node (us) |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['graph']} | {r['nodes']} | {1e3 * r['step_s']['default']:.2f} | "
              f"{1e3 * r['step_s']['priority']:.2f} | {r['ratio']:.3f} | "
              f"{r['overhead_per_node_us']:+.2f} |" for r in rows]
    with open(os.path.join(args.out, "executor_overhead.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
