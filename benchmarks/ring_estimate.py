"""fastt's all-reduce data parallelism against the analytical ring all-reduce estimate.

    python benchmarks/ring_estimate.py [--out benchmarks/results]

On simulated V100s (NVLink, 25 GB/s per link direction), VGG-19 and ResNet-200 at the
simulated testbed's strong-scaling batch, 4 and 8 GPUs. The estimate is the compute of one
replica (one device running the model at its share of the batch) plus the ring's transfer
time, 2(n-1)/n x the gradient bytes / the link bandwidth, less what overlaps: wait-free
backpropagation (Poseidon, Zhang et al., ATC 2017; MG-WFBP, Shi et al., INFOCOM 2019)
sends each bucket as soon as the backward pass has made it, so the ring hides behind the
backward pass but for the last bucket, which the backward pass makes last:

    forward + max(backward, ring - ring of the last bucket) + ring of the last bucket + updates

With no overlap (compute + ring) and full overlap (max of the two) as bounds. fastt's
data-parallel step is its graph (mirrored variables, fused buckets, reduce-scatter and
all-gather along the ring, each device running its ready ops by priority, the ring's
first) simulated with one bulk transfer at a time per link direction; TF-slim's layout
(``data-parallel-ps``) beside it. Writes ring_estimate.json and ring_estimate.md.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import models as zoo_models  # noqa: E402
from benchmarks.common import write_json  # noqa: E402
from benchmarks.simulated import training_graph  # noqa: E402

from fastt import dtypes  # noqa: E402
from fastt.costs.source import StaticCosts  # noqa: E402
from fastt.sched.sim.device_spec import LINKS, parse  # noqa: E402
from fastt.passes.ring import SCOPE  # noqa: E402
from fastt.sched.search.planning import Planning  # noqa: E402
from fastt.sched.strategy import plan  # noqa: E402

MODELS = ("vgg_19", "resnet_200")
GPUS = (4, 8)


def gradient_bytes(graph) -> float:
    """Bytes of the weights the step trains (one gradient each)."""
    trained = {op.inputs[0].op for op in graph if "Apply" in op.type}
    return float(sum(math.prod(graph[v].attrs["shape"]) *
                     (dtypes.itemsize(str(graph[v].attrs["dtype"])) or 4) for v in trained))


def last_bucket_bytes(graph) -> float:
    """Bytes of the all-reduce's last bucket (the first layers' gradients) in fastt's
    data-parallel graph."""
    fused = {op.meta.split_of: op.outputs[0].nbytes or 0.0 for op in graph
             if op.name.startswith(SCOPE) and op.name.endswith("/fused/part0")}
    return float(fused[max(fused, key=lambda b: int(b.rsplit("bucket", 1)[1]))])


def phases(graph, fetch, seconds) -> dict[str, float]:
    """Seconds of one replica's forward pass, backward pass (``gradients/``) and updates
    (the rest of what the step runs), on one device."""
    step = graph.fan_in(fetch)
    out = {"forward": 0.0, "backward": 0.0, "updates": 0.0}
    for op in step:
        kind = "backward" if op.name.startswith("gradients/") else \
            "updates" if any(k in op.type for k in ("Apply", "Assign")) or \
            op.name.split("/")[0] in ("Momentum", "GradientDescent", "Adam") else "forward"
        out[kind] += seconds.get(op.name, 0.0)
    return out


def row(model: zoo_models.Model, n: int) -> dict:
    graph, fetch, seconds = training_graph(model, model.batch)
    ds = parse(f"{n}xV100")
    costs = StaticCosts(seconds, ds)
    out = {"model": model.name, "gpus": n, "batch": model.batch}
    shared = Planning(graph, ds.devices, costs, ds.copy_bytes_per_s, fetch)
    for name in ("data-parallel", "data-parallel-ps"):
        s = plan(graph, ds.devices, costs, name, shared=shared)
        out[name] = s.simulated_step_time_s
        if name == "data-parallel":
            out["last_bucket_bytes"] = last_bucket_bytes(s.graph)
    rg, rfetch, rseconds = training_graph(model, model.batch // n)
    one = parse("1xV100")
    out["replica_compute_s"] = plan(rg, one.devices, StaticCosts(rseconds, one), "single",
                                    one.copy_bytes_per_s, fetches=rfetch).simulated_step_time_s
    out.update({f"replica_{k}_s": v for k, v in phases(rg, rfetch, rseconds).items()})
    out["gradient_bytes"] = gradient_bytes(graph)
    latency, bandwidth = LINKS["nvlink"]
    share = 2 * (n - 1) / n / bandwidth
    out["ring_s"] = share * out["gradient_bytes"]
    tail = share * out["last_bucket_bytes"]
    # the single-device step beyond the ops' own times (launch, reach): with the updates
    other = out["replica_compute_s"] - sum(out[f"replica_{k}_s"] for k in
                                           ("forward", "backward", "updates"))
    out["estimate_s"] = (out["replica_forward_s"] +
                         max(out["replica_backward_s"], out["ring_s"] - tail) + tail +
                         out["replica_updates_s"] + other)
    out["estimate_no_overlap_s"] = out["replica_compute_s"] + out["ring_s"]
    out["estimate_full_overlap_s"] = max(out["replica_compute_s"], out["ring_s"])
    out["ratio"] = out["data-parallel"] / out["estimate_s"]
    return out


def table(rows: list[dict]) -> str:
    lines = ["| model | GPUs | batch | one replica's compute (forward + backward + rest) "
             "| ring transfers (last bucket) | estimate (bounds: no overlap / full) "
             "| fastt all-reduce DP | ratio | TF-slim PS DP |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = {k: r[k] * 1e3 for k in r if k.endswith("_s") or k.startswith("data-")}
        lines.append(
            f"| {r['model']} | {r['gpus']} | {r['batch']} | {ms['replica_compute_s']:.1f} ms "
            f"({ms['replica_forward_s']:.1f} + {ms['replica_backward_s']:.1f} + "
            f"{ms['replica_compute_s'] - ms['replica_forward_s'] - ms['replica_backward_s']:.1f})"
            f" | {ms['ring_s']:.1f} ms ({r['gradient_bytes'] / 1e6:.0f} MB; "
            f"{r['last_bucket_bytes'] / 1e6:.0f} MB) "
            f"| {ms['estimate_s']:.1f} ms ({ms['estimate_no_overlap_s']:.1f} / "
            f"{ms['estimate_full_overlap_s']:.1f}) "
            f"| {ms['data-parallel']:.1f} ms | {r['ratio']:.3f} "
            f"| {ms['data-parallel-ps']:.1f} ms |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    by_name = {m.name: m for m in zoo_models.SIMULATED}
    rows = []
    for name in MODELS:
        for n in GPUS:
            rows.append(row(by_name[name], n))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    assert all(math.isfinite(r["data-parallel"]) for r in rows)
    write_json(os.path.join(args.out, "ring_estimate.json"), {"rows": rows})
    with open(os.path.join(args.out, "ring_estimate.md"), "w", encoding="utf-8") as f:
        f.write("# All-reduce data parallelism against the analytical ring estimate "
                "(simulated V100s)\n\n" + table(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
