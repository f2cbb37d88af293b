"""Batches no data-parallel replica holds, on simulated 16 GB V100s: for each model, the largest
global batch that all-reduce data parallelism fits (each replica its share of the batch), then
1.5 times that batch planned by fastt (``fastt plan``'s planner, its default 60 s budget) and
the throughput of the fitting plan against data parallelism at its largest batch.

    python benchmarks/memory_plans.py [--models NAME ...] [--devices 8xV100:dgx1]
                                      [--out benchmarks/results]

The largest batch is searched in steps of the devices (each device an equal share): the peak of
a replica is affine in its batch, so two graphs predict it, and graphs at that batch and the
next confirm it (``fastt.sched.search.memory_fit.data_parallel_peaks``: the memory model of the
replicas' placement). Simulated: no GPU ran; throughput is the global batch over the predicted
step time. Writes memory_plans.json and memory_plans.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import replace
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import machine, write_results  # noqa: E402

GiB = 2 ** 30
GROWTH = 1.5  # the batch planned, over the largest data parallelism fits
# name -> (zoo model, its arguments, the global batch the search starts from)
MODELS: dict[str, tuple[str, dict[str, Any], int]] = {
    "bert_large": ("bert", {"layers": 24, "seq_len": 128}, 64),
    "gnmt": ("gnmt", {"layers": 4, "hidden": 1024, "src_len": 20, "tgt_len": 20,
                      "src_vocab": 32000, "tgt_vocab": 32000}, 256),
    "vgg_19": ("vgg_19", {"image_size": 224}, 256),
    "resnet_200": ("resnet_v2_200", {"image_size": 224}, 64),
}


def build(model: str, batch: int) -> Any:
    """The training step of ``model`` at global ``batch`` as fastt's IR."""
    import tensorflow as tf

    from fastt import zoo
    from fastt.adapters import tf_import
    tf.compat.v1.disable_eager_execution()
    name, kwargs, _ = MODELS[model]
    built = zoo.build(name, batch_size=batch, **kwargs)
    g = tf_import.from_tf_graph(built.graph, name=model)
    g.meta = replace(g.meta, collections={"train_op": [built.train_op.name]})
    return g


def dp_peak(model: str, batch: int, devices: list) -> float:
    """The fullest device's peak (bytes) under all-reduce data parallelism at ``batch``."""
    from fastt import plan_cmd
    from fastt.sched.search.memory_fit import data_parallel_peaks
    g = build(model, batch)
    step = g.fan_in(plan_cmd.fetches(g))
    return max(data_parallel_peaks(step, devices, True)[1])


def largest_dp_batch(model: str, devices: list, log: list[str]) -> tuple[int, float]:
    """The largest global batch (a multiple of the devices) whose replicas all fit, and its
    peak."""
    D, limit = len(devices), min(d.memory for d in devices)
    peaks: dict[int, float] = {}

    def peak(b: int) -> float:
        if b not in peaks:
            t0 = time.perf_counter()
            peaks[b] = dp_peak(model, b, devices)
            log.append(f"{model}: batch {b}, fullest replica {peaks[b] / GiB:.2f} GiB "
                       f"({time.perf_counter() - t0:.0f} s)")
            print(log[-1], flush=True)
        return peaks[b]
    b0 = MODELS[model][2]
    p0, p1 = peak(b0), peak(2 * b0)
    per = (p1 - p0) / b0  # bytes per sample of the global batch
    b = max(D, D * math.floor((b0 + (limit - p0) / per) / D))
    while peak(b) > limit and b > D:
        b -= D
    while peak(b + D) <= limit:
        b += D
    return b, peak(b)


def plan(model: str, batch: int, spec: str) -> dict[str, Any]:
    """fastt's plans of ``model`` at ``batch`` on ``spec`` (OS-DPOS, data parallelism both
    ways): each one's step time, throughput, what it recomputed and its replicas."""
    from fastt import plan_cmd
    from fastt.errors import FasttError
    from fastt.sched.search.osdpos import clock
    from fastt.sched.strategy import Strategy
    g = build(model, batch)
    t0 = clock()
    setup = plan_cmd.prepare(g, spec, deadline=t0 + 60.0)
    try:
        chosen, others = plan_cmd.plan_all(setup, "os-dpos", ["data-parallel",
                                                              "data-parallel-ps"])
        plans: list[tuple[str, Strategy | str]] = [("os-dpos", chosen)] + list(others.items())
    except FasttError as e:  # nothing fits: each says why
        plans = [(name, str(e)) for name in ("os-dpos", "data-parallel", "data-parallel-ps")]
    out: dict[str, Any] = {"batch": batch, "ops": len(g), "plan_s": clock() - t0}
    for name, s in plans:
        if isinstance(s, Strategy):
            out[name] = {"step_s": s.predicted_step_time_s,
                         "samples_per_s": batch / s.predicted_step_time_s,
                         "recomputed_ops": s.recomputed, "micro_batches": s.micro_batches,
                         "replicas": s.replicas,
                         "splits": len(s.splits)}
        else:
            out[name] = {"declined": s}
    return out


def run_model(model: str, spec: str) -> dict[str, Any]:
    from fastt.sched.sim.device_spec import parse
    devices = parse(spec).devices
    D, log = len(devices), []
    b_dp, peak = largest_dp_batch(model, devices, log)
    b_fit = D * math.ceil(GROWTH * b_dp / D)
    return {"model": model, "devices": spec, "device_memory_bytes": devices[0].memory,
            "dp_batch": b_dp, "dp_peak_bytes": peak, "probes": log,
            "at_dp_batch": plan(model, b_dp, spec), "at_fit_batch": plan(model, b_fit, spec)}


def markdown(doc: dict, heading: str = "#") -> str:
    """The table of ``memory_plans.json`` (also a section of the benchmark report)."""
    lines = [f"{heading} Batches no replica holds (simulated 16 GB V100s)", "",
             f"{doc['machine']}; {doc['when']}. `python benchmarks/memory_plans.py`: per model, "
             "the largest global batch all-reduce data parallelism fits on "
             f"`{doc['devices']}` (each replica its share; the memory model of the replicas' "
             f"placement), then {GROWTH}x that batch planned by `fastt plan`'s planner (60 s "
             "budget). Throughput: the global batch over the predicted step (simulated: no GPU "
             "ran). Recomputed: forward ops computed again in the backward pass; accumulated: the "
             "micro-batches each replica runs in turn, gradients summed once; replicas: the "
             "data-parallel replicas (or a pipeline's micro-batches) of the plan.", "",
             "| model | DP's largest batch | DP (samples/s) | planned batch | plan | step (ms) "
             "| samples/s | vs DP at its largest | recomputed | accumulated | replicas |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        dp = r["at_dp_batch"]["data-parallel"]
        for name in ("os-dpos", "data-parallel", "data-parallel-ps"):
            s = r["at_fit_batch"][name]
            if "declined" in s:
                lines.append(f"| {r['model']} | {r['dp_batch']} | {dp['samples_per_s']:.1f} | "
                             f"{r['at_fit_batch']['batch']} | {name} | declined: "
                             f"{s['declined']} | | | | | |")
                continue
            lines.append(
                f"| {r['model']} | {r['dp_batch']} | {dp['samples_per_s']:.1f} | "
                f"{r['at_fit_batch']['batch']} | {name} | {1e3 * s['step_s']:.1f} | "
                f"{s['samples_per_s']:.1f} | {s['samples_per_s'] / dp['samples_per_s']:.3f}x | "
                f"{s['recomputed_ops']} | {s['micro_batches']} | {s['replicas']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--devices", default="8xV100:dgx1")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    path = os.path.join(args.out, "memory_plans.json")
    kept: list[dict] = []  # a run of some models keeps the others' rows
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        if old.get("devices") == args.devices:
            kept = [r for r in old["rows"] if r["model"] not in args.models]
    rows = kept
    for m in args.models:  # written after each model: a long run keeps what it finished
        rows = [r for r in rows if r["model"] != m] + [run_model(m, args.devices)]
        rows.sort(key=lambda r: list(MODELS).index(r["model"]))
        doc = {"machine": machine(), "when": time.strftime("%Y-%m-%d %H:%M UTC",
                                                           time.gmtime()),
               "devices": args.devices, "growth": GROWTH, "rows": rows}
        write_results(args.out, "memory_plans", doc, markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
