"""Strategy-computation time: DPOS on random layered DAGs, OS-DPOS on real training graphs.

    python benchmarks/strategy_time.py [--quick] [--out benchmarks/results]

Targets on a 2-core machine: DPOS on 100k ops x 8 devices <= 5 s; OS-DPOS <= 10 s per CNN
(VGG-19, Inception-v3, ResNet-v2-152) and <= 60 s for a base Transformer, on the
data-parallel graphs for 8 simulated V100s. Writes strategy_time.json and strategy_time.md.
Each timing is the median of --repeats runs (DPOS) or one run (OS-DPOS).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import machine  # noqa: E402
from fastt.sched import Device, Problem, dpos  # noqa: E402

TARGET_DPOS_100K_8 = 5.0
TARGETS_OSDPOS = {"vgg_19": 10.0, "inception_v3": 10.0, "resnet_v2_152": 10.0,
                  "transformer": 60.0}
MODELS = {  # zoo name -> builder arguments (strong-scaling batch for 8 GPUs)
    "vgg_19": {"batch_size": 64},
    "inception_v3": {"batch_size": 64},
    "resnet_v2_152": {"batch_size": 64},
    "transformer": {"layers": 6, "d_model": 512, "heads": 8, "d_ff": 2048, "seq_len": 128,
                    "vocab": 32000, "batch_size": 64},
}


def layered_dag(n: int, devices: int, seed: int = 0, width: int = 100) -> Problem:
    """n ops in layers of ``width``, each fed by 2 random ops of the layer before."""
    rnd = random.Random(seed)
    layers = [list(range(k, min(k + width, n))) for k in range(0, n, width)]
    edges = [(rnd.choice(a), j, rnd.uniform(1e3, 1e6)) for a, b in zip(layers, layers[1:])
             for j in b for _ in range(2)]
    w = [[rnd.uniform(1e-5, 1e-3)] * devices for _ in range(n)]
    devs = [Device(f"/job:localhost/replica:0/task:0/device:GPU:{d}") for d in range(devices)]
    return Problem.build(n, edges, w, devs, intercept=5e-6, slope=1 / 25e9)


def bench_dpos(sizes: list[int], device_counts: list[int], repeats: int) -> list[dict]:
    rows = []
    for n in sizes:
        for d in device_counts:
            p = layered_dag(n, d)
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                s = dpos(p)
                times.append(time.perf_counter() - t)
            rows.append({"ops": n, "devices": d, "dpos_s": statistics.median(times),
                         "makespan_s": s.makespan})
            print(f"DPOS {n:>6} ops x {d} devices: {rows[-1]['dpos_s']:.3f} s", flush=True)
    return rows


def bench_osdpos(models: list[str], devices: int) -> list[dict]:
    import tensorflow as tf

    from fastt import plan_cmd
    from fastt.passes.data_parallel import data_parallel
    from fastt.sched.sim.device_spec import parse
    from fastt.sched.strategy import plan
    tf.compat.v1.disable_eager_execution()
    rows = []
    spec = f"{devices}xV100"
    ds = parse(spec)
    for name in models:
        t = time.perf_counter()
        graph = _load_model(name)
        costs = plan_cmd.cost_source(graph, ds, "analytical", plan_cmd.fetches(graph))
        prep = time.perf_counter() - t
        dp_ops = len(data_parallel(graph, devices))
        result = {}
        for strategy in ("data-parallel", "dpos", "os-dpos"):
            s = plan(graph, ds.devices, costs, strategy, ds.copy_bytes_per_s,
                     workers=os.cpu_count() or 1)
            result[strategy] = s
            print(f"{name} {strategy}: {s.plan_time_s:.2f} s, predicted "
                  f"{s.predicted_step_time_s * 1e3:.2f} ms", flush=True)
        os_ = result["os-dpos"]
        rows.append({"model": name, "ops": len(graph), "dp_graph_ops": dp_ops,
                     "devices": devices, "costs_s": prep,
                     "os_dpos_s": os_.plan_time_s, "dpos_runs": os_.dpos_runs,
                     "target_s": TARGETS_OSDPOS.get(name),
                     "splits": [s.to_list() for s in os_.splits],
                     "predicted_ms": {k: v.predicted_step_time_s * 1e3
                                      for k, v in result.items()}})
    return rows


def _load_model(name: str):
    from fastt import zoo
    from fastt.adapters.tf_import import from_tf_graph
    built = zoo.build(name, **MODELS[name])
    g = from_tf_graph(built.graph, name=name)
    g.meta = dataclasses.replace(g.meta, collections={"train_op": [built.train_op.name]})
    return g


def markdown(result: dict) -> str:
    lines = ["# Strategy time", "",
             f"Machine: {result['machine']}; {result['when']}.", "",
             "## DPOS on random layered DAGs (median of repeats)", "",
             "| ops | devices | DPOS time (s) |", "| ---: | ---: | ---: |"]
    lines += [f"| {r['ops']} | {r['devices']} | {r['dpos_s']:.3f} |" for r in result["dpos"]]
    lines += ["", f"Target: 100k ops x 8 devices <= {TARGET_DPOS_100K_8} s.", "",
              f"## OS-DPOS on data-parallel graphs ({result['devices']} simulated V100)", "",
              "| model | ops | DP-graph ops | OS-DPOS time (s) | target (s) | DPOS runs | "
              "splits | predicted DP / DPOS / OS-DPOS (ms) |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in result["osdpos"]:
        p = r["predicted_ms"]
        lines.append(f"| {r['model']} | {r['ops']} | {r['dp_graph_ops']} | "
                     f"{r['os_dpos_s']:.2f} | {r['target_s']} | {r['dpos_runs']} | "
                     f"{len(r['splits'])} | {p['data-parallel']:.2f} / {p['dpos']:.2f} / "
                     f"{p['os-dpos']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one model")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    args = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sizes = [1000, 10000] if args.quick else [1000, 10000, 100000]
    models = args.models[:1] if args.quick else args.models
    result = {"machine": machine(),
              "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "devices": 8,
              "dpos": bench_dpos(sizes, [2, 4, 8], args.repeats),
              "osdpos": bench_osdpos(models, 8)}
    os.makedirs(args.out, exist_ok=True)
    name = "strategy_time_quick" if args.quick else "strategy_time"
    with open(os.path.join(args.out, name + ".json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, name + ".md"), "w", encoding="utf-8") as f:
        f.write(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
