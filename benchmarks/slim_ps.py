"""FastT's headline, like for like: VGG-19 on 4 V100s of a DGX-1, strong scaling, OS-DPOS
against TF-slim's data parallelism as it runs and against all-reduce data parallelism.

    python benchmarks/slim_ps.py [--batch 64] [--devices 4xV100:dgx1] [--out benchmarks/results]

FastT (Middleware 2020) reports up to 59.4% over TF-slim's data parallelism (1.594x), VGG-19
on 4 GPUs, strong scaling. TF-slim's ``model_deploy`` keeps the variables and their updates
on the host CPU (``fastt.sched.placers.host_ps``); fastt's ``data-parallel-ps`` keeps them on
GPU 0. Every layout is simulated here on the same V100s (link contention, one transfer at a
time per link direction), with the testbed's calibrated op costs and with the analytical
estimates as they are, and with two hosts: a DGX-1's (two Xeon E5-2698 v4, four channels of
DDR4-2133 each: ``fastt.sched.sim.device_spec.HOST_MEMORY_BYTES_PER_S``) and the paper's
testbed's (two Xeon Platinum 8163, six channels of DDR4-2666 each). Writes slim_ps.json and
slim_ps.md.
"""
from __future__ import annotations

import os
import platform
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import write_results  # noqa: E402
from benchmarks.models import Model  # noqa: E402

PAPER = 1.594  # FastT's Table 1: VGG-19, 4 GPUs, strong scaling, over TF-slim's DP
PAPER_HOST_BYTES_PER_S = 6 * 2666e6 * 8  # one Xeon Platinum 8163's six DDR4-2666 channels
STRATEGIES = ("single", "data-parallel", "data-parallel-ps", "os-dpos")


def run(model: Model, spec: str, calibrated: bool) -> dict[str, Any]:
    """Every layout of ``model`` on ``spec`` under one cost table."""
    from benchmarks.simulated import HOST_PS, host_ps_step, training_graph
    from fastt.costs.source import StaticCosts
    from fastt.plan_cmd import Setup, plan_each
    from fastt.sched.sim.device_spec import parse
    graph, fetch, seconds = training_graph(model, model.batch, calibrated)
    ds = parse(spec)
    setup = Setup(graph, spec, ds, fetch, StaticCosts(seconds, ds))
    steps: dict[str, float | str] = {}
    planned = plan_each(setup, STRATEGIES)
    for name, s in planned.items():
        steps[name] = s if isinstance(s, str) else s.simulated_step_time_s
    ps = planned.get("data-parallel-ps")
    if not isinstance(ps, str) and ps is not None:
        steps[HOST_PS] = host_ps_step(ps, ds, seconds, graph)
        steps[f"{HOST_PS} (paper's host)"] = host_ps_step(
            ps, ds, seconds, graph, PAPER_HOST_BYTES_PER_S)
    return {"costs": "calibrated" if calibrated else "analytical", "steps_s": steps}


def markdown(doc: dict[str, Any], level: str = "#") -> str:
    m = doc["meta"]
    lines = [f"{level} FastT's headline, like for like: VGG-19 on 4 V100s of a DGX-1", "",
             f"{m['model']} at a global batch of {m['batch']} (strong scaling) on "
             f"`{m['devices']}`, simulated (no GPU here): step times and OS-DPOS's speedup over "
             "each layout. DP: all-reduce data parallelism (NCCL's ring over NVLink pairs); "
             "DP-PS: the gradients summed and applied on GPU 0; DP-PS-CPU: TF-slim's "
             "model_deploy as it runs, the variables and their updates on the host CPU, each "
             "GPU reaching it over PCIe 3.0 x16, the updates slower there by the ratio of "
             "memory bandwidths (a DGX-1's two Xeon E5-2698 v4, or the paper's testbed's two "
             "Xeon Platinum 8163). FastT's paper measured 1.594x over TF-slim's data "
             f"parallelism in this setting. {m['platform']}, {m['date']}.", "",
             "| costs | layout | step (ms) | samples/s | OS-DPOS speedup over it |",
             "|---|---|---:|---:|---:|"]
    for r in doc["runs"]:
        fastt = r["steps_s"].get("os-dpos")
        for name, t in r["steps_s"].items():
            if isinstance(t, str):
                lines.append(f"| {r['costs']} | {name} | n/a ({t}) | | |")
                continue
            speed = f"{t / fastt:.3f}" if isinstance(fastt, float) else "n/a"
            lines.append(f"| {r['costs']} | {name} | {1e3 * t:.1f} | {m['batch'] / t:.0f} | "
                         f"{speed} |")
    lines += ["", f"FastT's paper: {PAPER}x over TF-slim's data parallelism (measured on its "
              "testbed's V100s)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    import argparse
    import logging
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64, help="global batch (default 64, the "
                    "simulated testbed's strong-scaling batch of VGG-19)")
    ap.add_argument("--devices", default="4xV100:dgx1")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.getLogger("fastt").setLevel(logging.ERROR)
    import tensorflow as tf
    model = Model("vgg_19", "vgg_19", {"image_size": 224}, args.batch)
    runs = []
    for calibrated in (True, False):
        t0 = time.perf_counter()
        runs.append(run(model, args.devices, calibrated))
        print(f"{runs[-1]['costs']}: {time.perf_counter() - t0:.0f} s", flush=True)
    doc = {"meta": {"model": model.name, "batch": args.batch, "devices": args.devices,
                    "platform": platform.platform(), "tensorflow": tf.__version__,
                    "date": time.strftime("%Y-%m-%d"), "paper": PAPER},
           "runs": runs}
    write_results(args.out, "slim_ps", doc, markdown(doc))


if __name__ == "__main__":
    main()
