"""The simulator's fidelity on the real testbed, for the benchmark report: each variant's
predicted step time against its measured one, apart for the plans that ran before their
blocks (calibrated on their own steps) and those that never ran, the host's drift between a
plan's calibration and its blocks, and the ranking (``benchmarks.ranking``)."""
from __future__ import annotations

import os
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.ranking import drift_table, ranking_section, sittings_table  # noqa: E402


def fidelity_section(real: dict, variants: list[str], out: str) -> list[str]:
    """The section's lines; writes its plot (fidelity.png) to ``out``."""
    lines = ["## Simulator fidelity (real testbed)", "",
             "Predicted: the simulator's step time from the profiled cost models, links "
             "contention-free (DPOS's model); contended: one transfer at a time per link "
             "direction (how OS-DPOS picks its final plan). Error = (predicted - measured) / "
             "measured. The cost models charge kernels that overlap on a device their share "
             "of it, are calibrated against untraced steps (tracing's own work out, the "
             "step's overhead in, with a lone device's gaps between kernels; a plan "
             "profiled over both workers, what its untraced steps took beyond its own "
             "replay), fit each link "
             "on the lower decile of its transfers, charge gRPC transfers to the cores of "
             "both ends (probed share; a call in a burst its probed seconds), hold a "
             "tensor a busy one-core sender produced before it took the request (its "
             "probed wait, or its first pause), and add the "
             "master's call to a remote worker (probed) to plans that use one. A plan "
             "run with its order enforced is replayed as control dependencies keep it: "
             "first come, first served within the edges the rewrite adds. A plan that ran "
             "before the blocks (profiled: one worker, data-parallel, fastt; or measured: "
             "the replanned plan) is calibrated on its own untraced steps, as the plugin's are; "
             "a plan that never ran (m-topo, data-parallel-ps, unless the same plan ran) "
             "pays beyond its replay the median of what the plans over both workers that "
             "ran pay, one vote per plan (on one worker: what a step there pays).",
             "",
             "| model | variant | measured (ms) | predicted (ms) | error | contended (ms) | "
             "error |", "|---|---|---:|---:|---:|---:|---:|"]
    errors: dict[str, list[float]] = {"predicted_s": [], "predicted_contended_s": []}
    for r in real["rows"]:
        for v in variants:
            if v not in r.get("predicted_s", {}):
                continue  # not a plan of fastt's (TensorFlow's MWMS)
            cells = []
            for key, errs in errors.items():
                t = r.get(key, {}).get(v)
                e = None if t is None else (t - r["step_s"][v]) / r["step_s"][v]
                if e is not None:
                    errs.append(abs(e))
                cells += ["n/a", "n/a"] if e is None else [f"{1e3 * t:.2f}", f"{100 * e:+.0f}%"]
            lines.append(f"| {r['model']} | {v} | {1e3 * r['step_s'][v]:.2f} | " +
                         " | ".join(cells) + " |")
    if errors["predicted_s"]:
        lines += ["", "Median absolute error: " + ", ".join(
            f"{label} {100 * statistics.median(errs):.0f}%" for label, errs in
            zip(("predicted", "contended"), errors.values()) if errs) +
            f" over {len(errors['predicted_s'])} runs.", *_ran_before(real, variants),
            *_net_of_drift(real, variants), "",
            "![fidelity](fidelity.png)", ""]
    lines += drift_table(real)
    lines += sittings_table(real)
    lines += ranking_section(real, variants)
    _plot(real["rows"], variants, out)
    return lines


def _ran_before(real: dict, variants: list[str]) -> list[str]:
    """The predictions' median absolute error apart for the plans that ran before the
    blocks (profiled, or measured: calibrated on their own steps) and for
    those that never ran before they were predicted (the model's own reach)."""
    errs: dict[bool, list[float]] = {True: [], False: []}
    for r in real["rows"]:
        keys = r.get("plan", {})
        ran = {keys.get(v, v) for v in (*r.get("profiled_step_s", {}),
                                        *r.get("calibrated_step_s", {}))}
        for v in variants:
            t = r.get("predicted_s", {}).get(v)
            if t is not None:
                errs[keys.get(v, v) in ran].append(abs(t - r["step_s"][v]) / r["step_s"][v])
    return ["", "Median absolute error of " + "; of ".join(
        f"{label}: {100 * statistics.median(e):.1f}% over {len(e)} runs (worst "
        f"{100 * max(e):.1f}%)" for label, e in
        (("the plans that ran before the blocks", errs[True]),
         ("those that never ran before they were predicted", errs[False])) if e) + "."]


def _net_of_drift(real: dict, variants: list[str]) -> list[str]:
    """The predictions' error once each model's common shift is taken out: the one worker's
    median in the blocks over its level when the models were calibrated (``reference_level_s``;
    in runs before it was kept, the median of its records), which moves every plan of the
    model alike. It says how much of the error is the host's speed between preparation and
    blocks and how much the model's."""
    errs = []
    for r in real["rows"]:
        records, one = r.get("reference_step_s"), r["step_s"].get("one worker")
        if not records or not one:
            continue  # runs before the one worker's records were kept
        shift = one / r.get("reference_level_s", statistics.median(records))
        errs += [abs(t * shift - r["step_s"][v]) / r["step_s"][v]
                 for v in variants if (t := r.get("predicted_s", {}).get(v)) is not None]
    if not errs:
        return []
    return ["", "Net of the host's drift (each model's predictions scaled by the one worker's "
            "median in the blocks over its level when the cost models were calibrated): "
            f"median absolute error {100 * statistics.median(errs):.1f}% over {len(errs)} "
            f"runs, worst {100 * max(errs):.1f}%."]


def _plot(rows: list[dict], variants: list[str], out: str) -> None:
    """Predicted against measured step time per variant (fidelity.png)."""
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(4.6, 4.2))
    for v in (v for v in variants if all(v in r["predicted_s"] for r in rows)):
        ax.scatter([1e3 * r["step_s"][v] for r in rows], [1e3 * r["predicted_s"][v] for r in rows],
                   label=v, s=18)
    values = [1e3 * t for r in rows for t in (*r["predicted_s"].values(),
                                              *(r["step_s"][v] for v in r["predicted_s"]))]
    ax.plot([min(values) / 1.5, max(values) * 1.5], [min(values) / 1.5, max(values) * 1.5],
            color="black", linewidth=0.8, label="predicted = measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step (ms)")
    ax.set_ylabel("predicted step (ms)")
    ax.set_title("Simulator vs measurement")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "fidelity.png"), dpi=110)
    plt.close(fig)

