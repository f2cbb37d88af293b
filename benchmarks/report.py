"""The benchmark report: benchmarks/results/REPORT.md and its PNG plots, from the JSON results.

    python benchmarks/report.py [--out benchmarks/results]

Reads simulated.json, real.json, optimality.json, pipeline.json, transfer_priorities.json,
plan_time.json, memory_fidelity.json and memory_plans.json (whichever exist) and writes
REPORT.md with tables and plots: speedup over data parallelism per model and GPU count
(simulated, strong and weak scaling), each row's distance to a lower bound, strategy times,
the ordering and splitting ablations, ops per device, the split table, samples/second on the
real 2-worker testbed, the simulator's predicted step time against the measured one, each
placer's distance to the exact optimum on small graphs, pipelines against the other plans, what
ordering the weight transfers by need gives, and `fastt plan`'s wall time end to end; the
memory model against TensorFlow's allocator, and batches no data-parallel replica holds.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.fidelity import fidelity_section  # noqa: E402

SHORT = {"single": "single", "data-parallel": "DP", "data-parallel-ps": "DP-PS", "dpos": "DPOS",
         "os-dpos": "OS-DPOS",
         "heft": "HEFT", "m-topo": "m-TOPO", "m-etf": "m-ETF", "m-sct": "m-SCT", "exact": "exact",
         "pipedream": "PipeDream", "data-parallel-ps-cpu": "DP-PS-CPU"}


def _load(out: str, name: str) -> dict | None:
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def _rows(sim: dict, scaling: str) -> list[tuple[str, dict]]:
    return [(m["model"], r) for m in sim["models"] for r in m["rows"] if r["scaling"] == scaling]


def simulated_section(sim: dict, out: str) -> list[str]:
    strategies = sim["meta"]["strategies"]
    calibrated = sim["meta"].get("costs") == "calibrated"
    lines = [f"## Simulated testbed (V100s, TensorFlow's analytical op costs"
             f"{', calibrated' if calibrated else ''})", "",
             "Step times are the simulator's, with one transfer at a time per link direction"
             + ("; op costs calibrated per op class against published V100 figures"
                if calibrated else "")
             + "; device sets as named (`:dgx1`: a DGX-1's hybrid cube-mesh of NVLinks). "
             "Speedup = data parallelism's step time / the strategy's (above 1: faster than DP; "
             "DP is the all-reduce layout, NCCL's ring on GPUs of one server, DP-PS the "
             "parameter-server layout with GPU 0 as the server, DP-PS-CPU TF-slim's "
             "model_deploy as it runs, the server on the host CPU: FastT's baseline). "
             "`n/a`: the strategy could not be computed (the reason is in simulated.json, e.g. "
             "data parallelism when a replica does not fit 16 GB).", ""]
    older = [f"{m['model']} ({m.get('when', 'an earlier run')})" for m in sim["models"]
             if m.get("when") != sim["meta"].get("when")]
    if older and sim["meta"].get("when"):
        lines += [f"Models run on {sim['meta']['when']}; kept from earlier runs: "
                  f"{', '.join(older)}.", ""]
    for scaling in ("strong", "weak"):
        rows = _rows(sim, scaling)
        if not rows:
            continue
        lines += [f"### Speedup over data parallelism, {scaling} scaling", "",
                  "| model | devices | batch | DP (ms) | " +
                  " | ".join(SHORT[s] for s in strategies) +
                  " | OS-DPOS over DP-PS | OS-DPOS over DP-PS-CPU | OS-DPOS samples/s |",
                  "|---|---|---:|---:|" + "---:|" * (len(strategies) + 3)]
        for model, r in rows:
            st = r["strategies"]
            dp = st.get("data-parallel", {}).get("simulated_s")
            cells = [_fmt(st.get(s, {}).get("speedup_over_dp")) for s in strategies]
            fastt = st.get("os-dpos", {}).get("simulated_s")
            over = [_fmt(t and fastt and t / fastt) for t in (
                st.get(k, {}).get("simulated_s") for k in ("data-parallel-ps",
                                                          "data-parallel-ps-cpu"))]
            lines.append(f"| {model} | {r['devices']} | {r['batch']} | "
                         f"{_fmt(dp and 1e3 * dp, '.1f')} | " + " | ".join(cells + over) +
                         f" | {_fmt(st.get('os-dpos', {}).get('samples_per_s'), '.0f')} |")
        lines += ["", f"![speedup {scaling}](sim_speedup_{scaling}.png)", ""]
        _speedup_plot(rows, os.path.join(out, f"sim_speedup_{scaling}.png"), scaling)
    lines += _geomean_table(sim)
    lines += _bound_table(sim)
    rows = _rows(sim, "strong")
    lines += ["### Strategy time (strong scaling; seconds to compute each strategy)", "",
              "| model | devices | ops | " + " | ".join(SHORT[s] for s in strategies) +
              " | OS-DPOS DPOS runs |", "|---|---|---:|" + "---:|" * (len(strategies) + 1)]
    ops = {m["model"]: m.get("ops") for m in sim["models"]}
    for model, r in rows:
        st = r["strategies"]
        lines.append(f"| {model} | {r['devices']} | {ops.get(model)} | " + " | ".join(
            _fmt(st.get(s, {}).get("plan_time_s")) for s in strategies) +
            f" | {st.get('os-dpos', {}).get('dpos_runs', 'n/a')} |")
    lines += ["", "### Ablations of OS-DPOS (strong scaling)", "",
              "Ordering: OS-DPOS's placement run first come, first served (TensorFlow's own "
              "order) / with its planned order; `kept`: the order OS-DPOS keeps, the faster "
              "in the simulator. Splitting: OS-DPOS without splits / with.",
              "Above 1: what ordering or splitting gains.", "",
              "| model | devices | FIFO (ms) | ordered (ms) | ordering gain | kept | "
              "no splits (ms) | splits (ms) | splitting gain | splits |",
              "|---|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for model, r in rows:
        a = r.get("ablation")
        if not a:
            continue
        n = len(r["strategies"]["os-dpos"].get("splits", []))
        lines.append(f"| {model} | {r['devices']} | {1e3 * a['fifo_s']:.2f} | "
                     f"{1e3 * a['ordered_s']:.2f} | {a['fifo_s'] / a['ordered_s']:.3f} | "
                     f"{_kept(a)} | {1e3 * a['no_split_s']:.2f} | {1e3 * a['split_s']:.2f} | "
                     f"{a['no_split_s'] / a['split_s']:.3f} | {n} |")
    lines += ["", "### Ops per device (OS-DPOS, strong scaling)", "",
              "Replicas: the batch cut into that many shares (1: the model graph). Kept whole: "
              "the weights that run unreplicated on one device while the rest is data "
              "parallel, so their gradients never cross a link (`fastt.passes.hybrid`; FastT's "
              "Table 5 found VGG-19's fully connected layers best kept on one device, its "
              "convolutions replicated).", "",
              "| model | devices | replicas | kept whole | ops per device |",
              "|---|---|---:|---|---|"]
    for model, r in rows:
        s = r["strategies"].get("os-dpos", {})
        if "ops_per_device" in s:
            whole = ", ".join(f"`{w}`" for w in s.get("kept_whole", [])) or "-"
            lines.append(f"| {model} | {r['devices']} | {s['replicas']} | {whole} | "
                         f"{' '.join(map(str, s['ops_per_device']))} |")
    lines += ["", "### Ops split by OS-DPOS (strong scaling)", "",
              "| model | devices | op | dimension | n | time before split (ms) | "
              "parameter bytes | step before -> after (ms) |",
              "|---|---|---|---|---:|---:|---:|---|"]
    any_split = False
    for model, r in rows:
        for sp in r["strategies"].get("os-dpos", {}).get("splits", []):
            any_split = True
            lines.append(f"| {model} | {r['devices']} | `{sp['op']}` | {sp['dim']} | {sp['n']} "
                         f"| {_fmt(sp['time_before_s'] and 1e3 * sp['time_before_s'], '.3f')} "
                         f"| {sp['param_bytes']} | {_fmt(1e3 * sp['step_before_s'], '.2f')} -> "
                         f"{_fmt(1e3 * sp['step_after_s'], '.2f')} |")
    if not any_split:
        lines.append("| (none) | | | | | | | |")
    return lines + [""]


def _kept(ablation: dict) -> str:
    """The order OS-DPOS kept (results before it chose one kept its planned order)."""
    return "planned" if ablation.get("kept_order", True) else "FIFO"


def _geomean_table(sim: dict) -> list[str]:
    """Per scaling and device set, the geometric mean over the models of OS-DPOS's speedup
    over all-reduce data parallelism, and the least."""
    lines = ["### Geometric mean over the models", "",
             "OS-DPOS's speedup over all-reduce data parallelism (DP), per scaling and device "
             "set: the geometric mean over the models where both were computed, and the least "
             "of them.", "", "| scaling | devices | models | geo-mean | least |",
             "|---|---|---:|---:|---|"]
    for scaling in ("strong", "weak"):
        by_spec: dict[str, list[tuple[str, float]]] = {}
        for model, r in _rows(sim, scaling):
            x = r["strategies"].get("os-dpos", {}).get("speedup_over_dp")
            if x:
                by_spec.setdefault(r["devices"], []).append((model, x))
        for spec, xs in by_spec.items():
            geo = math.exp(sum(math.log(x) for _, x in xs) / len(xs))
            low = min(xs, key=lambda mx: mx[1])
            lines.append(f"| {scaling} | {spec} | {len(xs)} | {geo:.3f} | "
                         f"{low[1]:.3f} ({low[0]}) |")
    return lines + [""]


def _bound_table(sim: dict) -> list[str]:
    """Each row's lower bound on any plan's step time and OS-DPOS's distance to it."""
    rows = [(m, r) for scaling in ("strong", "weak") for m, r in _rows(sim, scaling)
            if "bound" in r]
    if not rows:
        return []
    lines = ["### Distance to the limit", "",
             "A lower bound on the step time of any plan fastt can make "
             "(`fastt.sched.search.bounds`): "
             "the larger of the critical path with free transfers (each op on its fastest "
             "device; an op fastt can cut into parts, by the batch or a split rule, at 1/D of "
             "its time) and the total compute over the D devices. OS-DPOS / bound: 1 would be "
             "optimal.", "",
             "| model | scaling | devices | critical path (ms) | compute / D (ms) | bound (ms) | "
             "OS-DPOS (ms) | OS-DPOS / bound |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for model, r in rows:
        b, mine = r["bound"], r["strategies"].get("os-dpos", {}).get("simulated_s")
        lines.append(f"| {model} | {r['scaling']} | {r['devices']} | "
                     f"{1e3 * b['critical_path_s']:.2f} | {1e3 * b['work_s']:.2f} | "
                     f"{1e3 * b['s']:.2f} | {_fmt(mine and 1e3 * mine)} | "
                     f"{_fmt(mine and b['s'] and mine / b['s'])} |")
    ratios = [r["strategies"]["os-dpos"]["simulated_s"] / r["bound"]["s"] for _, r in rows
              if r["strategies"].get("os-dpos", {}).get("simulated_s") and r["bound"]["s"]]
    if ratios:
        lines += ["", f"OS-DPOS / bound: median {statistics.median(ratios):.2f}, worst "
                  f"{max(ratios):.2f} over {len(ratios)} rows."]
    return lines + [""]


def losses_section(sim: dict | None, real: dict | None) -> list[str]:
    """Every run where a baseline beat fastt by more than 1%: the first thing to read."""
    lines = ["## Where fastt loses", "",
             "Every run in this report where another strategy or variant was more than 1% "
             "faster than fastt (OS-DPOS).", ""]
    found = []
    for m in (sim or {}).get("models", []):
        for r in m["rows"]:
            st = r["strategies"]
            mine = st.get("os-dpos", {}).get("simulated_s")
            for name, other in st.items():
                t = other.get("simulated_s")
                if mine and t and name != "os-dpos" and t < 0.99 * mine:
                    found.append(f"- simulated, {m['model']} {r['scaling']} {r['devices']}: "
                                 f"{SHORT[name]} {1e3 * t:.1f} ms vs OS-DPOS {1e3 * mine:.1f} ms "
                                 f"({mine / t:.2f}x)")
    for r in (real or {}).get("rows", []):
        choice = r.get("adaptive", {}).get("choice")
        for own, label in (("fastt", "fastt"), (choice, f"fastt, adaptive ({choice})")):
            mine = r["step_s"].get(own)
            for name, t in r["step_s"].items():
                if mine and name != own and t < 0.99 * mine:
                    found.append(f"- measured, {r['model']}: {name} {1e3 * t:.1f} ms vs "
                                 f"{label} {1e3 * mine:.1f} ms ({mine / t:.2f}x)")
    return lines + (found or ["- nowhere"]) + [""]


def _speedup_plot(rows: list[tuple[str, dict]], path: str, scaling: str) -> None:
    specs = sorted({r["devices"] for _, r in rows}, key=lambda s: (len(s), s))
    models = list(dict.fromkeys(m for m, _ in rows))
    fig, ax = plt.subplots(figsize=(max(7, 1.2 * len(models) + 1.5), 3.6))
    width = 0.8 / max(len(specs), 1)
    for k, spec in enumerate(specs):
        ys = []
        for model in models:
            r = next((r for m, r in rows if m == model and r["devices"] == spec), None)
            ys.append((r or {}).get("strategies", {}).get("os-dpos", {}).get("speedup_over_dp")
                      or 0.0)
        ax.bar([i + k * width for i in range(len(models))], ys, width, label=spec)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + width * (len(specs) - 1) / 2 for i in range(len(models))], models,
                  rotation=20)
    ax.set_ylabel("OS-DPOS speedup over DP")
    ax.set_title(f"Simulated V100s, {scaling} scaling (0: DP not computable)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _block_steps(real: dict) -> str:
    """How many steps the real testbed's blocks took: one count, or each model's where a
    block spans a least time."""
    meta = real["meta"]
    if not meta.get("min_block_s"):
        return f"{meta['steps_per_block']} steps"
    each = ", ".join(f"{r['model']} {r.get('steps_per_block', meta['steps_per_block'])}"
                     for r in real["rows"])
    return (f"at least {meta['steps_per_block']} steps, and at least {meta['min_block_s']:g} s "
            f"({each})")


def real_section(real: dict, out: str) -> list[str]:
    meta = real["meta"]
    variants = list(real["rows"][0]["step_s"]) if real["rows"] else []
    lines = ["## Real testbed (2 TensorFlow gRPC workers on 127.0.0.1, one core each)", "",
             f"Samples/second, median of {meta['repeats']} rotating blocks of "
             f"{_block_steps(real)} per variant, all variants in one run "
             f"(TensorFlow {meta['tensorflow']}{', ' + meta['cpu'] if meta.get('cpu') else ''}; "
             f"1-minute load average at the start: "
             f"{meta.get('load_average_at_start', float('nan')):.1f}). "
             "`one worker` is the original graph as the "
             "user's script runs it; `fastt` is OS-DPOS planned from profiled costs, its order "
             "enforced with control dependencies; `fastt, replanned` its second round, once the "
             "first ran and was profiled; `no order`: the same plan in TensorFlow's own order. "
             "`adaptive` is where the session plugin would end, decided by its rule on steps of "
             "their own before the timed blocks: each round (data-parallel, fastt, fastt "
             "replanned) replaces the graph kept so far only when significantly faster, and a "
             "plan kept with its order enforced is then tried without, kept only when that is "
             "significantly faster. `adaptive / FIFO`: its step time over the same placement's "
             "in TensorFlow's own order (above 1: the enforced order costs).", "",
             "`DP / MWMS`: fastt's data parallelism over TensorFlow's MultiWorkerMirroredStrategy; "
             "`adaptive / best`: where the plugin ends over the better of one worker and MWMS "
             "(what a user would otherwise run).", "",
             "| model | batch | " + " | ".join(variants) + " | fastt / DP | fastt / one worker "
             "| adaptive: choice | adaptive / DP | adaptive / one worker | adaptive / FIFO "
             "| DP / MWMS | adaptive / best |",
             "|---|---:|" + "---:|" * (len(variants) + 2) + "---|---:|---:|---:|---:|---:|"]
    for r in real["rows"]:
        sps = r["samples_per_s"]
        a = r.get("adaptive", {})
        mwms = sps.get("MWMS")
        chosen = sps.get(a.get("choice", ""))
        best = max(sps["one worker"], mwms or 0.0)
        lines.append(f"| {r['model']} | {r['batch']} | " +
                     " | ".join(f"{sps[v]:.1f}" for v in variants) +
                     f" | {r['speedup_over_dp']['fastt']:.2f} | "
                     f"{r['speedup_over_one_worker']['fastt']:.2f} | "
                     f"{a.get('choice', 'n/a')} | {_fmt(a.get('speedup_over_dp'))} | "
                     f"{_fmt(a.get('speedup_over_one_worker'))} | "
                     f"{_fmt(a.get('ratio_to_its_fifo'))} | "
                     f"{_fmt(mwms and sps['data-parallel'] / mwms)} | "
                     f"{_fmt(chosen and chosen / best)} |")
    lines += ["", "![real testbed](real_samples.png)", "",
              "### What fastt planned", "",
              "| model | ops | replicas | ops per device | splits | plan time (s) | "
              "data-parallel: ops per device |",
              "|---|---:|---:|---|---|---:|---|"]
    for r in real["rows"]:
        splits = ", ".join(f"`{s['op']}` {s['dim']}/{s['n']}" for s in r["splits"]) or "none"
        lines.append(f"| {r['model']} | {r['ops']} | {r['replicas']} | "
                     f"{' '.join(map(str, r['ops_per_device']))} | {splits} | "
                     f"{r['plan_time_s']:.2f} | "
                     f"{' '.join(map(str, r.get('ops_per_device_dp', []))) or '-'} |")
    lines += fidelity_section(real, variants, out)
    _real_plots(real, variants, out)
    return lines


def _real_plots(real: dict, variants: list[str], out: str) -> None:
    rows = real["rows"]
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(max(7, 1.3 * len(rows) + 2), 3.6))
    width = 0.8 / len(variants)
    for k, v in enumerate(variants):
        ax.bar([i + k * width for i in range(len(rows))],
               [r["speedup_over_one_worker"][v] for r in rows], width, label=v)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + width * (len(variants) - 1) / 2 for i in range(len(rows))],
                  [r["model"] for r in rows], rotation=20)
    ax.set_ylabel("samples/s relative to one worker")
    ax.set_title("2 workers x 1 core, measured")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(os.path.join(out, "real_samples.png"), dpi=110)
    plt.close(fig)


CALIBRATION_RULES = "## How the calibration rules were chosen"


def kept_section(out: str, heading: str = "## Summary") -> list[str]:
    """A section of the report kept by hand, as it stands, to be written again: the
    ``## Summary`` (its headline table, each row linking to the section its figure comes
    from) or ``CALIBRATION_RULES`` (figures of runs whose JSON is not kept)."""
    path = os.path.join(out, "REPORT.md")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if heading not in lines:
        return []
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines))
                if lines[i].startswith(("## ", "Regenerated by"))), len(lines))
    return lines[start:end]


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args(argv)
    sim, real = _load(args.out, "simulated.json"), _load(args.out, "real.json")
    if sim is None and real is None:
        sys.exit(f"no simulated.json or real.json in {args.out}: run benchmarks/run.py first")
    lines: list[str] = ["# fastt benchmark report", ""] + kept_section(args.out) + [
                        "Regenerated by `python benchmarks/run.py` (`--quick` for a smoke run); "
                        "every figure here comes from the JSON files next to this report.", ""]
    for doc in (sim, real):
        if doc is not None and doc["meta"].get("quick"):
            lines += ["**Quick run: a smoke test, not the full evaluation.**", ""]
            break
    lines += losses_section(sim, real)
    if sim is not None:
        lines += simulated_section(sim, args.out)
    if real is not None:
        lines += real_section(real, args.out)
    optimality = _load(args.out, "optimality.json")
    if optimality is not None:
        from benchmarks.optimality import markdown
        lines += markdown(optimality, "##").splitlines() + [""]
    pipelines = _load(args.out, "pipeline.json")
    if pipelines is not None:
        from benchmarks.pipeline import markdown as pipeline_markdown
        lines += pipeline_markdown(pipelines, "##").splitlines() + [""]
    priorities = _load(args.out, "transfer_priorities.json")
    if priorities is not None:
        from benchmarks.transfer_priorities import markdown as priorities_markdown
        lines += priorities_markdown(priorities, "##").splitlines() + [""]
    plan_times = _load(args.out, "plan_time.json")
    if plan_times is not None:
        from benchmarks.plan_time import markdown as plan_time_markdown
        lines += plan_time_markdown(plan_times, "##").splitlines() + [""]
    net = _load(args.out, "net_effect.json")
    if net is not None:
        from benchmarks.net_effect import markdown as net_markdown
        lines += net_markdown(net, "##").splitlines() + [""]
    memory = _load(args.out, "memory_fidelity.json")
    if memory is not None:
        from benchmarks.memory_fidelity import markdown as memory_markdown
        lines += memory_markdown(memory, "##").splitlines() + [""]
    memory_plans = _load(args.out, "memory_plans.json")
    if memory_plans is not None:
        from benchmarks.memory_plans import markdown as memory_plans_markdown
        lines += memory_plans_markdown(memory_plans, "##").splitlines() + [""]
    lines += kept_section(args.out, CALIBRATION_RULES)
    grounding = _load(args.out, "grounding.json")
    if grounding is not None:
        from benchmarks.grounding import markdown as grounding_markdown
        lines += grounding_markdown(grounding, "##").splitlines() + [""]
    slim_ps = _load(args.out, "slim_ps.json")
    if slim_ps is not None:
        from benchmarks.slim_ps import markdown as slim_ps_markdown
        lines += slim_ps_markdown(slim_ps, "##").splitlines() + [""]
    with open(os.path.join(args.out, "REPORT.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {os.path.join(args.out, 'REPORT.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
