"""Per-step overhead of serving the user's Session from fastt's inner session.

    python benchmarks/session_overhead.py [--quick] [--out benchmarks/results]

For each model: the plugin is installed in-process (2 logical CPU devices), the unchanged
training loop runs until fastt has finished planning, then blocks of steps alternate between
the user's ``sess.run([train_op, loss], feed_dict)`` (through fastt) and the same step run
directly on the inner session fastt opened (``inner.run(names, feeds by name)``). The ratio of
the two block times is taken per repeat; the median ratio is reported. Writes
session_overhead.json and session_overhead.md.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

from benchmarks.common import arguments, block  # noqa: E402

import fastt.plugin  # noqa: E402
from fastt import zoo  # noqa: E402
from fastt.plugin.settings import Settings, parse_devices  # noqa: E402
from tf_patches.session_hook import plugin_of  # noqa: E402

tf1 = tf.compat.v1
MODELS = {"mlp": {"batch_size": 64}, "small_cnn": {"batch_size": 32},
          "lenet": {"batch_size": 32}, "alexnet_v2": {"batch_size": 8, "image_size": 96}}
TARGET = 1.01  # through fastt / direct, median



def bench(name: str, kwargs: dict, steps: int, repeats: int) -> dict:
    m = zoo.build(name, opt="momentum", **kwargs)
    with m.graph.as_default():
        sess = tf1.Session(graph=m.graph)
    sess.run(m.init)
    feed = m.feed_dict()
    p = plugin_of(sess)
    for _ in range(200):  # the unchanged loop, until fastt stops planning
        sess.run([m.train_op, m.loss], feed)
        if p.controller is not None and p.controller.phase in ("steady", "off"):
            break
    inner = p.current
    assert inner is not p.user, "fastt did not take over the session"
    names = [m.train_op.name, m.loss.name]
    by_name = {t.name: v for t, v in feed.items()}
    through = lambda: sess.run([m.train_op, m.loss], feed)  # noqa: E731
    direct = lambda: inner.sess.run(names, by_name)  # noqa: E731
    block(through, steps), block(direct, steps)  # warm both paths
    ratios, t_through, t_direct = [], [], []
    for r in range(repeats):
        order = (through, direct) if r % 2 == 0 else (direct, through)
        times = {fn: block(fn, steps) for fn in order}
        t_through.append(times[through])
        t_direct.append(times[direct])
        ratios.append(times[through] / times[direct])
    sess.close()
    row = {"model": name, "strategy": inner.strategy.name if inner.strategy else "original",
           "through_fastt_s": statistics.median(t_through),
           "direct_s": statistics.median(t_direct), "ratio": statistics.median(ratios),
           "ratios": ratios}
    print(f"{name:>12}: {1e3 * row['through_fastt_s']:.3f} ms through fastt, "
          f"{1e3 * row['direct_s']:.3f} ms direct, ratio {row['ratio']:.4f}", flush=True)
    return row


def main() -> None:
    args = arguments(__doc__, steps=30, repeats=15)
    tf1.disable_eager_execution()
    devices, cpus = parse_devices("cpu:2")
    fastt.plugin.install(Settings(enabled=True, devices=devices, logical_cpus=cpus,
                                  dump_dir=tempfile.mkdtemp(), warmup_steps=3, profile_steps=2,
                                  measure_steps=4, max_rounds=2, reprofile_every=0,
                                  log_level="WARNING"))
    models = dict(list(MODELS.items())[:2]) if args.quick else MODELS
    steps, repeats = (10, 3) if args.quick else (args.steps, args.repeats)
    rows = [bench(n, kw, steps, repeats) for n, kw in models.items()]
    os.makedirs(args.out, exist_ok=True)
    meta = {"python": platform.python_version(), "tensorflow": tf.__version__,
            "cpus": os.cpu_count(), "steps_per_block": steps, "repeats": repeats,
            "target_ratio": TARGET}
    with open(os.path.join(args.out, "session_overhead.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    lines = ["# Session overhead: the user's Session through fastt vs the inner session",
             "", f"Median over {repeats} alternating blocks of {steps} steps; 2 logical CPU "
             f"devices; TensorFlow {tf.__version__}, {os.cpu_count()} cores. Target: ratio "
             f"<= {TARGET}.", "",
             "| model | running | through fastt (ms) | direct (ms) | ratio |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['strategy']} | {1e3 * r['through_fastt_s']:.3f} | "
              f"{1e3 * r['direct_s']:.3f} | {r['ratio']:.4f} |" for r in rows]
    with open(os.path.join(args.out, "session_overhead.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
