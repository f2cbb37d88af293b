"""Weight transfers ordered by need against TensorFlow's own (all at once), side by side on
the real testbed: a local 2-worker TensorFlow cluster, one core each.

    python benchmarks/transfer_priorities.py [--quick] [--models NAME ...] [--repeats R]
    python benchmarks/transfer_priorities.py --simulated [--models NAME ...]

Per model, as ``benchmarks/real.py`` prepares it (the original profiled on worker 0, the
links probed, data parallelism run and profiled), both data-parallel layouts are planned with
transfer priorities off and on (``fastt.sched.placers.transfer_order``; "on" is kept whatever the
simulator says). The four graphs run in TensorFlow's own op order, in blocks of S steps,
rotating who goes first, R repeats; per repeat each "on" block is divided by its layout's
"off" block, and the median ratio is reported (below 1: ordering pays). A layout with no
link carrying two groups of weights (the all-reduce mirrors its variables: only scalars such
as Adam's powers cross) has nothing to order and is not run twice. The simulator's figures
for both (one transfer at a time per link direction) stand beside.

``--simulated``: the paper's models on 4 and 8 simulated V100s (analytical costs, strong
scaling, ``benchmarks/simulated.py``'s set-up), both layouts planned with priorities on, the
step replayed with and without them (one transfer at a time per link direction). A GPU's
copies of one process run in the order they are issued, which the simulator's first-come
links already follow: there ordering by need can only change which weight goes first.

Both write their rows into transfer_priorities.json (``real`` and ``simulated``).
"""
from __future__ import annotations

import logging
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

from benchmarks import models as zoo_models  # noqa: E402
from benchmarks.common import block, cpu_model, measured_on, previous_full_run, \
    real_arguments, with_row, write_json  # noqa: E402
from benchmarks.real import Run, profile_into  # noqa: E402

from fastt.adapters.engine import Engine  # noqa: E402
from fastt.cluster import LocalCluster  # noqa: E402
from fastt.plugin.remote import on_cluster  # noqa: E402
from fastt.sched.sim.problem import Device  # noqa: E402

tf1 = tf.compat.v1
LAYOUTS = ("data-parallel", "data-parallel-ps")
SIMULATED = ("vgg_19", "alexnet", "lenet", "inception_v3", "transformer", "rnnlm")
SPECS = ("4xV100", "8xV100")


def bench(cluster: LocalCluster, model: zoo_models.Model, steps: int, repeats: int) -> dict:
    m = model.build()
    devices = [Device(cluster.device(i)) for i in range(2)]
    engine = Engine(m.graph, devices, [m.train_op.name, m.loss.name], target=cluster.target,
                    config=on_cluster(None), name=model.name)
    profile_into(engine, Run(cluster.target, engine.graph_def(), m), None, 3)
    engine.probe()
    dp = engine.plan("data-parallel", transfer_priorities="off")
    gd, merged = engine.rewrite(dp)
    profile_into(engine, Run(cluster.target, gd, m), merged, 3)
    runs, row = {}, {"model": model.name, "batch": model.batch, "layouts": {}}
    for layout in LAYOUTS:
        off = engine.plan(layout, transfer_priorities="off")
        on = engine.plan(layout, transfer_priorities="on")
        found = on.transfer_priorities or {"transfers": 0, "links": 0}
        row["layouts"][layout] = {
            "transfers_ordered": found["transfers"], "links": found["links"],
            "simulated_off_s": engine.predict(off, fifo=True, link_concurrency=1),
            "simulated_on_s": engine.predict(on, fifo=True, link_concurrency=1)}
        runs[(layout, "off")] = Run(cluster.target, engine.rewrite(off)[0], m)
        if found["transfers"]:
            runs[(layout, "on")] = Run(cluster.target, engine.rewrite(on)[0], m)
    names = list(runs)
    for r in runs.values():
        block(r.step, max(steps // 2, 2))  # warm up
    times: dict[tuple[str, str], list[float]] = {n: [] for n in names}
    for k in range(repeats):
        for name in names[k % len(names):] + names[:k % len(names)]:
            times[name].append(block(runs[name].step, steps))
    for r in runs.values():
        r.sess.close()
    for layout in LAYOUTS:
        out = row["layouts"][layout]
        out["off_s"] = statistics.median(times[(layout, "off")])
        if (layout, "on") in times:
            out["on_s"] = statistics.median(times[(layout, "on")])
            out["ratio_on_over_off"] = statistics.median(
                a / b for a, b in zip(times[(layout, "on")], times[(layout, "off")]))
            out["times_s"] = {"off": times[(layout, "off")], "on": times[(layout, "on")]}
        print(f"{model.name:>18} {layout:>17}: {out['transfers_ordered']} transfers ordered, "
              + (f"on/off {out['ratio_on_over_off']:.3f} (off {1e3 * out['off_s']:.1f} ms, "
                 f"on {1e3 * out['on_s']:.1f} ms)" if "on_s" in out else "nothing to order")
              + f"; simulated {1e3 * out['simulated_off_s']:.1f} -> "
                f"{1e3 * out['simulated_on_s']:.1f} ms", flush=True)
    return row


def simulated(model: zoo_models.Model) -> dict:
    """Both layouts of ``model`` on 4 and 8 simulated V100s, with and without priorities."""
    from benchmarks.simulated import training_graph
    from fastt.costs.source import StaticCosts
    from fastt.sched.sim.device_spec import parse
    from fastt.sched.search.planning import Planning
    from fastt.sched.strategy import plan
    graph, fetch, seconds = training_graph(model, model.batch)
    row: dict = {"model": model.name, "batch": model.batch, "devices": {}}
    for spec in SPECS:
        ds = parse(spec)
        shared = Planning(graph, ds.devices, StaticCosts(seconds, ds), ds.copy_bytes_per_s,
                          fetch, transfer_priorities="on")
        for layout in LAYOUTS:
            t = plan(graph, ds.devices, shared.costs, layout, shared=shared).transfer_priorities
            cell = {"transfers_ordered": t["transfers"] if t else 0}
            if t:
                cell.update(on_s=t["simulated_step_time_s"], off_s=t["simulated_without_s"],
                            ratio_on_over_off=t["simulated_step_time_s"]
                            / t["simulated_without_s"])
            row["devices"].setdefault(spec, {})[layout] = cell
            print(f"{model.name:>14} {spec} {layout:>17}: " + (
                f"{cell['transfers_ordered']} ordered, {1e3 * cell['off_s']:.2f} -> "
                f"{1e3 * cell['on_s']:.2f} ms" if t else "nothing to order"), flush=True)
    return row


def markdown(doc: dict, level: str = "##") -> str:
    """The report's section."""
    lines = [f"{level} Transfer priorities", "",
             "The weights a step reads from another device sent in the order their consumers "
             "need them (`fastt.sched.placers.transfer_order`), against TensorFlow's own order. "
             "`on / off`: step time with over without them (below 1: ordering pays).", ""]
    real = doc.get("real", {}).get("rows", [])
    if real:
        meta = doc["real"]["meta"]
        lines += [f"Real testbed (2 gRPC workers, one core each; median of {meta['repeats']} "
                  f"per-block ratios of {meta['steps_per_block']} steps, {meta['when']}):", "",
                  "| model | layout | weights ordered | off (ms) | on (ms) | on / off | "
                  "simulated on / off |", "|---|---|---:|---:|---:|---:|---:|"]
        for r in real:
            for layout, c in r["layouts"].items():
                sim = c["simulated_on_s"] / c["simulated_off_s"]
                lines.append(
                    f"| {r['model']} | {layout} | {c['transfers_ordered']} | "
                    f"{1e3 * c['off_s']:.1f} | "
                    + (f"{1e3 * c['on_s']:.1f} | {c['ratio_on_over_off']:.3f} | "
                       if "on_s" in c else "- | - | ") + f"{sim:.3f} |")
        lines.append("")
    sim_rows = doc.get("simulated", {}).get("rows", [])
    if sim_rows:
        lines += ["Simulated V100s (analytical costs, strong scaling):", "",
                  "| model | devices | layout | weights ordered | off (ms) | on (ms) | "
                  "on / off |", "|---|---|---|---:|---:|---:|---:|"]
        for r in sim_rows:
            for spec, layouts in r["devices"].items():
                for layout, c in layouts.items():
                    lines.append(f"| {r['model']} | {spec} | {layout} | "
                                 f"{c['transfers_ordered']} | " + (
                                     f"{1e3 * c['off_s']:.2f} | {1e3 * c['on_s']:.2f} | "
                                     f"{c['ratio_on_over_off']:.3f} |" if "on_s" in c
                                     else "- | - | - |"))
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    args = real_arguments(__doc__, ("--simulated", "simulated V100s instead"))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.getLogger("fastt").setLevel(logging.ERROR)
    tf1.disable_eager_execution()
    path = os.path.join(args.out, "transfer_priorities.json")
    cpu = cpu_model()
    whole = previous_full_run(path) or {}
    part = "simulated" if args.simulated else "real"
    doc = whole.get(part) if args.models and not args.quick else None
    if doc is not None and part == "real":
        measured_on(doc.get("meta", {}), cpu, path)
    steps, repeats = (3, 3) if args.quick else (args.steps, max(args.repeats, 3))
    doc = doc or {"meta": {"python": platform.python_version(), "tensorflow": tf.__version__,
                           "cpu": cpu, "cpus": os.cpu_count(), "steps_per_block": steps,
                           "repeats": repeats}, "rows": []}
    doc["meta"]["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    os.makedirs(args.out, exist_ok=True)
    whole = {**whole, part: doc, "meta": {"quick": args.quick}}

    def save(row: dict, zoo: list[zoo_models.Model]) -> None:
        doc["rows"] = with_row(doc["rows"], {**row, "load_average_at_start": load},
                               [m.name for m in zoo])
        write_json(path, whole)
    if args.simulated:
        for model in zoo_models.pick([m for m in zoo_models.SIMULATED if m.name in SIMULATED],
                                     args.models or (["lenet", "alexnet"] if args.quick
                                                     else None)):
            load = os.getloadavg()[0]
            save(simulated(model), zoo_models.SIMULATED)
        return
    models = zoo_models.pick(zoo_models.REAL_QUICK if args.quick else zoo_models.REAL,
                             args.models)
    with LocalCluster(workers=2, cores_per_worker=1) as cluster:
        for model in models:
            load = os.getloadavg()[0]
            save(bench(cluster, model, steps, repeats), zoo_models.REAL)


if __name__ == "__main__":
    main()
