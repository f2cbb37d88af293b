"""Per-step time of one strategy under three ways of ordering its ops, side by side.

    python benchmarks/ordering.py [--quick] [--out benchmarks/results]

For each model: profile the original training step over 2 logical CPU devices, plan DPOS
(placement and order, no splits) from the profiled costs, and build three graphs of the same
placement: TensorFlow's own FIFO order (no enforcement), the order enforced with control
dependencies, and the order written as priorities for fastt's priority executor. Blocks of
steps alternate between the three sessions; per repeat each time is divided by FIFO's, and
the median ratio is reported (below 1: faster than FIFO).

fastt's choice: what the session plugin would run in the end. In-process it enforces the
order with the priority executor, then tries the same placement in FIFO order and keeps that
unless its decision rule finds it significantly slower (``benchmarks.common.keeps_candidate``).
The decision is taken on its own steps, before the timed blocks, and the chosen mode's ratio
to FIFO is read from the timed blocks. Writes ordering.json and ordering.md.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

from benchmarks.common import arguments, block, keeps_candidate, training_session  # noqa: E402

from fastt import zoo  # noqa: E402
from fastt.adapters.engine import Engine  # noqa: E402
from fastt.plugin.settings import LOCAL_CPU  # noqa: E402
from fastt.sched.sim.problem import Device  # noqa: E402
from tf_patches import priority_executor  # noqa: E402

tf1 = tf.compat.v1
MODELS = {"mlp": {"batch_size": 64}, "small_cnn": {"batch_size": 32},
          "lenet": {"batch_size": 32}, "alexnet_v2": {"batch_size": 8, "image_size": 96},
          "vgg_16": {"batch_size": 4, "image_size": 32}, "lstm_lm": {"batch_size": 16}}
MODES = ("fifo", "control-dependencies", "priority-executor")
DEVICES = [LOCAL_CPU.format(i) for i in range(2)]


def config(priority: bool) -> tf1.ConfigProto:
    cfg = tf1.ConfigProto(device_count={"CPU": len(DEVICES)})
    if priority:
        cfg.experimental.executor_type = priority_executor.EXECUTOR_TYPE
    return cfg


def planned(m: zoo.TrainingGraph) -> Engine:
    """The model's engine, its costs profiled (3 steps) and its links probed."""
    engine = Engine(m.graph, [Device(d) for d in DEVICES], [m.train_op.name, m.loss.name],
                    config=config(False))
    with tf1.Session(graph=m.graph, config=config(False)) as sess:
        sess.run(m.init)
        engine.trace(sess, m.feed_dict(), steps=3, warmup=1)
    engine.probe()
    return engine


def bench(name: str, kwargs: dict, steps: int, repeats: int) -> dict:
    m = zoo.build(name, opt="momentum", **kwargs)
    engine = planned(m)
    strategy = engine.plan("dpos", split=False)
    graphs = {mode: engine.rewrite(strategy, "none" if mode == "fifo" else mode)[0]
              for mode in MODES}
    runs = {}
    for mode, gd in graphs.items():
        sess, fetches, feed = training_session(m, gd, config=config(mode == "priority-executor"))
        runs[mode] = (sess, lambda s=sess, f=fetches, d=feed: s.run(f, d))
    for _, fn in runs.values():
        block(fn, max(steps // 3, 2))  # warm every session up
    decision = keeps_candidate(runs["priority-executor"][1], runs["fifo"][1], steps,
                               tie_keeps=True)
    choice = "fifo" if decision["keep"] else "priority-executor"
    times = {mode: [] for mode in MODES}
    for r in range(repeats):
        order = MODES[r % 3:] + MODES[:r % 3]  # rotate who goes first
        for mode in order:
            times[mode].append(block(runs[mode][1], steps))
    for sess, _ in runs.values():
        sess.close()
    ratios = {mode: statistics.median(t / f for t, f in zip(times[mode], times["fifo"]))
              for mode in MODES}
    row = {"model": name, "ops": len(strategy.graph), "predicted_s":
           strategy.predicted_step_time_s,
           "step_s": {mode: statistics.median(t) for mode, t in times.items()},
           "ratio_to_fifo": ratios, "times_s": times, "choice": choice,
           "decision": decision, "choice_ratio_to_fifo": ratios[choice]}
    print(f"{name:>12}: FIFO {1e3 * row['step_s']['fifo']:.2f} ms; control deps "
          f"{ratios['control-dependencies']:.3f}x; priority executor "
          f"{ratios['priority-executor']:.3f}x; fastt keeps {choice} "
          f"({ratios[choice]:.3f}x)", flush=True)
    return row


def main() -> None:
    args = arguments(__doc__, steps=20, repeats=9)
    tf1.disable_eager_execution()
    if not priority_executor.load():
        sys.exit("the priority executor is not built; reinstall fastt with a C++ compiler")
    models = dict(list(MODELS.items())[:2]) if args.quick else MODELS
    steps, repeats = (5, 3) if args.quick else (args.steps, args.repeats)
    os.makedirs(args.out, exist_ok=True)
    rows, load_before = [], os.getloadavg()[0]
    for n, kw in models.items():  # results are rewritten after each model
        rows.append(bench(n, kw, steps, repeats))
        write(args.out, rows, steps, repeats, (load_before, os.getloadavg()[0]))


def write(out: str, rows: list, steps: int, repeats: int, load: tuple[float, float]) -> None:
    meta = {"python": platform.python_version(), "tensorflow": tf.__version__,
            "cpus": os.cpu_count(), "steps_per_block": steps, "repeats": repeats,
            "devices": DEVICES, "strategy": "dpos (profiled costs, no splits)",
            "load_average": {"before": load[0], "after": load[1]}}
    with open(os.path.join(out, "ordering.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    lines = ["# Op ordering: FIFO vs control dependencies vs the priority executor", "",
             f"One DPOS strategy per model over 2 logical CPU devices; median over {repeats} "
             f"rotating blocks of {steps} steps; ratio = step time / FIFO step time in the "
             f"same repeat (below 1 is faster). TensorFlow {tf.__version__}, "
             f"{os.cpu_count()} cores (load average {load[0]:.2f} before, {load[1]:.2f} "
             "after the last model). Logical CPU devices share one thread pool.", "",
             "fastt's choice: the session plugin's rule (the priority executor first, then the "
             "same placement in FIFO order, kept unless significantly slower: a tie drops the "
             "order), decided on separate steps before the timed blocks.", "",
             "| model | ops | FIFO (ms) | control deps (ratio) | priority executor (ratio) | "
             "fastt's choice | its ratio | decision (ratio, CI) |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['ops']} | {1e3 * r['step_s']['fifo']:.2f} | "
              f"{r['ratio_to_fifo']['control-dependencies']:.3f} | "
              f"{r['ratio_to_fifo']['priority-executor']:.3f} | {r['choice']} | "
              f"{r['choice_ratio_to_fifo']:.3f} | {r['decision']['verdict']} "
              f"({r['decision']['ratio']:.3f}, {r['decision']['ci_low']:.3f}-"
              f"{r['decision']['ci_high']:.3f}) |" for r in rows]
    with open(os.path.join(out, "ordering.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
