"""The simulated V100 testbed against published V100 measurements, and its calibration.

    python benchmarks/grounding.py [--quick] [--out benchmarks/results]

For each model that a published source measured in fp32 on one V100 and on eight
(``published_v100.json``), the zoo's model at the source's batch per GPU is simulated as
the testbed simulates every model (TensorFlow's analytical V100 op costs,
``benchmarks/simulated.py``): alone on one V100 (``single``), and data parallel over eight
V100s of a DGX-1 (``8xV100:dgx1``, ring all-reduce, weak scaling: the same batch per GPU;
each GPU fed its own share of the batch, as the sources' benchmarks feed theirs).
Devices are taken as unbounded in memory here: the figures are of speed; whether fastt's
memory model fits the batch in the source's 32 GB is its own column.

The error of each model, then a calibration held out honestly: a factor per op class
(``CLASSES``: compute-bound convolutions and matrix products, and the memory-bound rest)
fitted (non-negative least squares on relative error) to the single-V100 figures of every
model but one and scored on that one (leave one model out). The calibrated costs are
simulated again, one V100 and eight; the 8-V100 scaling efficiency (throughput on eight over
eight times that on one) is compared with the published one.

The 8-GPU step of each source also carries its all-reduces as the source ran them, which
fastt's data-parallel graph does not express (it buckets the gradients and sums batch norm's
statistics over the whole batch): tf_cnn_benchmarks (``--variable_update=replicated
--all_reduce_spec=nccl``, no gradient repacking) all-reduces each trainable variable's
gradient on its own, Horovod (DeepLearningExamples) fuses them into buffers of 64 MiB. Each
such all-reduce holds the GPUs for a time ``launch_s`` beyond its transfer (the NCCL kernel's
launch and the wait for every GPU to reach it), not hidden behind the backward pass: the step
on eight GPUs is the simulated one plus ``launch_s`` times the source's all-reduces.
``launch_s`` is fitted like the factors, on the other models' published scaling efficiencies
(least squares; leave one model out). Writes grounding.json and grounding.md.
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import time
from dataclasses import replace
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import published  # noqa: E402
from benchmarks.common import write_results  # noqa: E402
from benchmarks.models import Model  # noqa: E402

from fastt.costs.calibration import CLASSES, PATH, op_class, scaled  # noqa: E402

DEVICES = "8xV100:dgx1"
GPUS = 8
LAMBDA = ("lambda_tf_bench", "")
CASES = [  # (source, machine, the published model, the zoo's model at its batch per GPU)
    (*LAMBDA, "alexnet", Model("alexnet", "alexnet_v2", {"image_size": 224}, 1536)),
    (*LAMBDA, "inception_v3", Model("inception_v3", "inception_v3", {"image_size": 299}, 192)),
    (*LAMBDA, "resnet152", Model("resnet_152", "resnet_v2_152", {"image_size": 224}, 96)),
    (*LAMBDA, "resnet50_v1 (tf_cnn_benchmarks)", Model("resnet_50", "resnet_v2_50",
                                                       {"image_size": 224}, 192)),
    (*LAMBDA, "vgg16", Model("vgg_16", "vgg_16", {"image_size": 224}, 192)),
    ("dle_rn50_tf1_2006", "DGX-1", "resnet50_v1.5", Model("resnet_50", "resnet_v2_50",
                                                          {"image_size": 224}, 128)),
    ("dle_bert_tf1", "DGX-1 V100 16GB", "bert_large_pretrain_seq128", Model(
        "bert_large", "bert", {"layers": 24, "seq_len": 128, "predictions": 20}, 8)),
    ("dle_bert_tf1", "DGX-1 V100 32GB", "bert_large_pretrain_seq128", Model(
        "bert_large", "bert", {"layers": 24, "seq_len": 128, "predictions": 20}, 32)),
]
# How each source all-reduced its gradients (module docstring): one all-reduce per trainable
# variable, or Horovod's fusion buffers of FUSION_BYTES (HOROVOD_FUSION_THRESHOLD's default).
PER_VARIABLE, FUSED = "per-variable", "fused"
ALLREDUCE = {"lambda_tf_bench": PER_VARIABLE, "dle_rn50_tf1_2006": FUSED, "dle_bert_tf1": FUSED}
FUSION_BYTES = 64 * 2 ** 20
# The source's net where its variables are not the zoo model's: tf_cnn_benchmarks' and
# DeepLearningExamples' ResNets are v1 (v1.5) with a scale in every batch norm (weight, gamma
# and beta per convolution, as tf-slim's resnet_v1), the zoo's timed ResNets v2.
SOURCE_NETS = {"resnet_v2_50": "resnet_v1_50", "resnet_v2_152": "resnet_v1_152"}
LAUNCH_MAX_S = 5e-3  # the fit's bound on ``launch_s``
# Sources whose multi-GPU figures accumulate gradients over many micro-batches per
# all-reduce (BERT's pre-training: a global batch of 65536): their scaling efficiency says
# nothing of the all-reduce, so it is shown but not scored.
ACCUMULATES = {"dle_bert_tf1"}
QUICK = [0, 4]
CALIBRATION_NOTE = ("per-class factors fitted on every row of benchmarks/grounding.py "
                    "(published fp32 throughputs on one V100, sources in the benchmark report)")


def figures(doc: dict[str, Any], source: str, machine: str, model: str
            ) -> dict[int, dict[str, Any]]:
    """``source``'s fp32 figures of ``model`` on a ``machine`` (a part of its name; "": any)
    with a batch per GPU, by GPU count."""
    return {e["gpus"]: e for e in doc["throughput"] if e["source"] == source
            and e["model"] == model and e["precision"] == "fp32"
            and machine in (e.get("machine") or "") and e.get("batch_per_gpu")}


def unbounded(spec: str) -> Any:
    """The device set ``spec`` with devices of unbounded memory."""
    from fastt.sched.sim.device_spec import parse
    ds = parse(spec)
    return replace(ds, devices=[replace(d, memory=math.inf) for d in ds.devices])


def simulate(graph: Any, fetch: list[str], seconds: dict[str, float], gpus: int) -> float:
    """The simulated step: alone on one V100 (``gpus`` 1), else data parallel over the
    first ``gpus`` of the DGX-1, each GPU fed its own share of the batch
    (``per_gpu_input``)."""
    from fastt.costs.source import StaticCosts
    from fastt.passes.data_parallel import batch_inputs
    from fastt.sched.strategy import plan, replay
    ds = unbounded(DEVICES)
    devices, costs = ds.devices[:gpus], StaticCosts(seconds, ds)
    name = "single" if gpus == 1 else "data-parallel"
    s = plan(graph, devices, costs, name, ds.copy_bytes_per_s, fetches=fetch)
    if gpus == 1:
        return s.simulated_step_time_s
    found = batch_inputs(graph)
    inputs = {r.op for r in found[1]} if found else set()
    return replay(s, devices, costs, graph, ds.copy_bytes_per_s, link_concurrency=1,
                  adjust=lambda p: per_gpu_input(p, s.graph, inputs))[1].makespan


def per_gpu_input(p: Any, graph: Any, inputs: set[str]) -> None:
    """The sources feed each GPU its own share of the batch (tf_cnn_benchmarks its own
    synthetic images or a staged prefetch; DeepLearningExamples one Horovod process and input
    pipeline per GPU), where the data-parallel graph cuts one batch on the first GPU and sends
    the shares: in problem ``p`` (of ``graph``), the ops cutting the batch ``inputs`` cost
    nothing and send nothing."""
    for i, name in enumerate(p.names):
        op = graph[name]
        if op.type == "SplitV" and any(r.op in inputs for r in op.inputs):
            p.w[i] = [0.0] * p.num_devices
            for _, e in p.succs[i]:
                p.edge_bytes[e] = 0.0
                p.edge_tensors[e] = [(key, 0.0) for key, _ in p.edge_tensors[e]]


def allreduces(model: Model, source: str) -> int:
    """The all-reduces of a training step as ``source`` ran ``model`` on several GPUs
    (``ALLREDUCE``): its net's (``SOURCE_NETS``) trainable variables, or the fusion buffers
    their gradients fill."""
    from fastt import zoo
    built = zoo.build(SOURCE_NETS.get(model.zoo_name, model.zoo_name), batch_size=1,
                      **model.kwargs)
    variables = built.graph.get_collection("trainable_variables")
    if ALLREDUCE[source] == PER_VARIABLE:
        return len(variables)
    nbytes = sum(v.shape.num_elements() * v.dtype.size for v in variables)
    return math.ceil(nbytes / FUSION_BYTES)


def by_class(graph: Any, seconds: dict[str, float]) -> dict[str, float]:
    """The seconds of the graph's ops summed by ``op_class``."""
    out = dict.fromkeys(CLASSES, 0.0)
    for op in graph:
        out[op_class(op.type)] += seconds.get(op.name, 0.0)
    return out


def fit(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Per-class factors so that the rows' class sums times the factors come closest to their
    measured single-V100 steps (non-negative least squares on relative error)."""
    import numpy as np
    from scipy.optimize import nnls
    a = np.array([[r["class_s"][c] / r["measured_step_s"] for c in CLASSES] for r in rows])
    f, _ = nnls(a, np.ones(len(rows)))
    return dict(zip(CLASSES, (float(x) for x in f)))


def measure(model: Model, doc: dict[str, Any], source: str, machine: str,
            published_name: str) -> dict[str, Any]:
    """One model: published figures, simulated steps (1 and 8 GPUs), its graphs kept for the
    calibrated runs."""
    from benchmarks.simulated import training_graph
    from fastt.sched.search.memory_fit import peak_memory_one_device
    pub = figures(doc, source, machine, published_name)
    if not {1, GPUS} <= set(pub) or pub[1]["batch_per_gpu"] != model.batch:
        raise SystemExit(f"{source}: no fp32 figures of {published_name} on 1 and {GPUS} GPUs "
                         f"at batch {model.batch} per GPU")
    b = model.batch
    t0 = time.perf_counter()
    g1, f1, s1 = training_graph(model, b, calibrated=False)
    g8, f8, s8 = training_graph(model, GPUS * b, calibrated=False)
    row = {"model": model.name, "zoo": model.zoo_name, "published": published_name,
           "batch_per_gpu": b, "source": source, "machine": pub[1].get("machine"),
           "published_1": pub[1]["value"], "published_8": pub[GPUS]["value"],
           "measured_step_s": b / pub[1]["value"], "class_s": by_class(g1, s1),
           "peak_memory_gib": peak_memory_one_device(g1) / 2 ** 30,
           "step_1_s": simulate(g1, f1, s1, 1), "step_8_s": simulate(g8, f8, s8, GPUS),
           "allreduce": ALLREDUCE[source], "allreduces": allreduces(model, source)}
    row["wall_s"] = time.perf_counter() - t0
    return row | {"_graphs": (g1, f1, s1, g8, f8, s8)}


def efficiency(thr8: float, thr1: float) -> float:
    return thr8 / (GPUS * thr1)


def launched(r: dict[str, Any], launch_s: float) -> float:
    """Row ``r``'s calibrated scaling efficiency with each of its source's all-reduces
    holding the GPUs ``launch_s``."""
    return r["calibrated_1_s"] / (r["calibrated_8_s"] + launch_s * r["allreduces"])


def fit_launch(rows: list[dict[str, Any]]) -> float:
    """The ``launch_s`` that brings the scored rows' calibrated scaling efficiencies closest
    to the published ones (least squares, bounded by ``LAUNCH_MAX_S``)."""
    from scipy.optimize import minimize_scalar
    rs = scored(rows)
    if not rs:
        return 0.0
    found = minimize_scalar(lambda x: sum((launched(r, x) - r["efficiency_published"]) ** 2
                                          for r in rs), bounds=(0.0, LAUNCH_MAX_S),
                            method="bounded", options={"xatol": 1e-8})
    return float(found.x)


def calibrate(rows: list[dict[str, Any]]) -> None:
    """Leave one model out: each row's factors fitted on the rows of the other zoo models
    (none of the same model, from any source), its steps simulated again with them; then
    its ``launch_s`` fitted on the other models' scaling efficiencies."""
    for r in rows:
        f = fit([o for o in rows if o["zoo"] != r["zoo"]])
        g1, f1, s1, g8, f8, s8 = r["_graphs"]
        r["factors"] = f
        r["calibrated_1_s"] = simulate(g1, f1, scaled(g1, s1, f), 1)
        r["calibrated_8_s"] = simulate(g8, f8, scaled(g8, s8, f), GPUS)
        r["efficiency_published"] = efficiency(r["published_8"], r["published_1"])
    for r in rows:
        r["launch_s"] = fit_launch([o for o in rows if o["zoo"] != r["zoo"]])
        r["launched_8_s"] = r["calibrated_8_s"] + r["launch_s"] * r["allreduces"]
    for r in rows:
        b = r["batch_per_gpu"]
        thr = {k: b * (GPUS if k.endswith("8_s") else 1) / r[k] for k in
               ("step_1_s", "step_8_s", "calibrated_1_s", "launched_8_s")}
        r["simulated_1"], r["simulated_8"] = thr["step_1_s"], thr["step_8_s"]
        r["calibrated_1"], r["calibrated_8"] = thr["calibrated_1_s"], thr["launched_8_s"]
        r["error_1"] = r["simulated_1"] / r["published_1"] - 1
        r["calibrated_error_1"] = r["calibrated_1"] / r["published_1"] - 1
        r["efficiency_simulated"] = efficiency(r["simulated_8"], r["simulated_1"])
        r["efficiency_calibrated"] = efficiency(r["calibrated_8"], r["calibrated_1"])
        r["efficiency_factors_only"] = launched(r, 0.0)


def markdown(doc: dict[str, Any], level: str = "#") -> str:
    meta, rows = doc["meta"], doc["rows"]
    lines = [f"{level} The simulated V100 against published measurements", "",
             "Published: fp32 training throughput on one V100 and on eight, at the batch per "
             "GPU the source gives (sources below). Simulated: the zoo's model at that batch, "
             "TensorFlow's analytical V100 op costs, alone on one V100 and data parallel over "
             f"`{DEVICES}` (ring all-reduce, the ring over NVLink pairs as NCCL builds it; "
             "each GPU fed its own share of the batch, as the sources' benchmarks feed "
             "theirs, not one batch cut on the first GPU), devices unbounded in memory. "
             "Calibrated: a factor on the convolutions and matrix products and one on the "
             "other ops, fitted on the other models' single-V100 figures, "
             "never on the model scored (leave one model out: no row of the same zoo model, "
             "from any source). On eight GPUs the calibrated step also carries the source's "
             "all-reduces as it ran them (tf_cnn_benchmarks: one per trainable variable; "
             "Horovod: one per 64 MiB fusion buffer), each holding the GPUs a launch time "
             "fitted on the other models' published scaling efficiencies (leave one model "
             "out); \"factors only\" is the efficiency without it. Throughput in samples/s "
             "(images, BERT's sequences); scaling "
             "efficiency is the 8-GPU throughput over eight times the 1-GPU one (not scored "
             "where the source accumulates gradients over many micro-batches per all-reduce: "
             f"{', '.join(sorted(ACCUMULATES))}). The zoo's ResNets are v2 "
             "(pre-activation), the sources' v1 and v1.5 (their all-reduces counted on "
             "tf-slim's resnet_v1, which like the sources' has a scale in every batch norm); "
             "AlexNet is the zoo's alexnet_v2. "
             f"{meta['platform']}, TensorFlow {meta['tensorflow']}, {meta['date']}.", "",
             "| model | source | batch/GPU | 1 GPU published | simulated | error | calibrated | "
             "error | factors (compute, memory) | 8 GPUs published | calibrated | "
             "all-reduces | launch (us) | efficiency published | simulated | factors only | "
             "calibrated | memory model peak (GiB) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"
             "---:|---:|"]
    for r in rows:
        f = r["factors"]
        lines.append(
            f"| {r['model']} | {r['source']} | {r['batch_per_gpu']} | {r['published_1']:g} | "
            f"{r['simulated_1']:.0f} | {100 * r['error_1']:+.0f}% | {r['calibrated_1']:.0f} | "
            f"{100 * r['calibrated_error_1']:+.0f}% | {f['compute']:.2f}, {f['memory']:.2f} | "
            f"{r['published_8']:g} | {r['calibrated_8']:.0f} | "
            f"{r['allreduces']} ({r['allreduce']}) | {1e6 * r['launch_s']:.0f} | "
            f"{r['efficiency_published']:.3f} | {r['efficiency_simulated']:.3f} | "
            f"{r['efficiency_factors_only']:.3f} | {r['efficiency_calibrated']:.3f}"
            f"{'' if r['source'] not in ACCUMULATES else ' (not scored)'} | "
            f"{r['peak_memory_gib']:.1f} |")
    s = doc["summary"]
    n, fa = len(rows), s["factors_all"]
    lines += ["", f"Within 20% on one V100 before calibration: {s['within_20_raw']} of {n}; "
              f"after, held out: {s['within_20_calibrated']} of {n} rows, "
              f"{s['models_within_20_calibrated']} of {s['models']} models (a model with a "
              "row within). Scaling efficiency within 10 points of the published, held out: "
              f"{s['efficiency_within_10']} of {s['efficiency_scored']}. "
              f"Median absolute error on one V100: {100 * s['median_abs_error_raw']:.0f}% raw, "
              f"{100 * s['median_abs_error_calibrated']:.0f}% calibrated. Factors fitted on "
              f"all rows: compute {fa['compute']:.2f}, memory {fa['memory']:.2f}; an "
              f"all-reduce's launch fitted on all scored rows: "
              f"{1e6 * s['launch_all_s']:.0f} us. Scaling efficiency within 10 points with "
              f"the factors only: {s['efficiency_within_10_factors_only']} of "
              f"{s['efficiency_scored']}.", "",
              "Sources:", ""]
    for k, src in doc["sources"].items():
        lines.append(f"- {k}: {src['title']} ({src['url_or_repo_path']}); machine as "
                     "published: " + "; ".join(sorted({r["machine"] for r in rows
                                                      if r["source"] == k})))
    return "\n".join(lines) + "\n"


def scored(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows whose scaling efficiency is compared (``ACCUMULATES``' are not)."""
    return [r for r in rows if r["source"] not in ACCUMULATES]


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"within_20_raw": sum(abs(r["error_1"]) <= 0.2 for r in rows),
            "within_20_calibrated": sum(abs(r["calibrated_error_1"]) <= 0.2 for r in rows),
            "efficiency_within_10": sum(abs(r["efficiency_calibrated"]
                                            - r["efficiency_published"]) <= 0.10
                                        for r in scored(rows)),
            "efficiency_scored": len(scored(rows)),
            "models_within_20_calibrated": len({r["zoo"] for r in rows
                                                if abs(r["calibrated_error_1"]) <= 0.2}),
            "models": len({r["zoo"] for r in rows}),
            "efficiency_within_10_factors_only": sum(
                abs(r["efficiency_factors_only"] - r["efficiency_published"]) <= 0.10
                for r in scored(rows)),
            "launch_all_s": fit_launch(rows),
            "median_abs_error_raw": statistics.median(abs(r["error_1"]) for r in rows),
            "median_abs_error_calibrated": statistics.median(abs(r["calibrated_error_1"])
                                                             for r in rows),
            "factors_all": fit(rows)}


def write_calibration(doc: dict[str, Any], path: str = PATH) -> None:
    """The factors fitted on every row, for ``fastt.costs.calibration``, with what they were
    fitted on."""
    from fastt.jsonio import write_json
    write_json(path, {"note": CALIBRATION_NOTE, "kinds": {"V100": {
        "factors": doc["summary"]["factors_all"], "date": doc["meta"]["date"],
        "rows": [f"{r['model']} ({r['source']}, batch {r['batch_per_gpu']})"
                 for r in doc["rows"]]}}})


def main() -> None:
    import argparse
    import platform
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="two models")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    import tensorflow as tf
    doc = published.load()
    cases = [CASES[i] for i in QUICK] if args.quick else CASES
    rows = []
    for source, machine, name, model in cases:
        rows.append(measure(model, doc, source, machine, name))
        r = rows[-1]
        print(f"{model.name:>14}: published {r['published_1']:g} samples/s, simulated "
              f"{model.batch / r['step_1_s']:.0f} ({r['wall_s']:.0f} s)", flush=True)
    calibrate(rows)
    for r in rows:
        del r["_graphs"]
    out = {"meta": {"platform": platform.platform(), "tensorflow": tf.__version__,
                    "date": time.strftime("%Y-%m-%d"), "quick": args.quick},
           "sources": {k: doc["sources"][k] for k in sorted({r["source"] for r in rows})},
           "rows": rows, "summary": summary(rows)}
    if not args.quick:  # the factors of every row: the simulated testbed's calibration
        write_calibration(out)
    write_results(args.out, "grounding", out, markdown(out))


if __name__ == "__main__":
    main()
