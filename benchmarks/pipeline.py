"""Pipelines against fastt's other plans on simulated V100s, side by side.

    python benchmarks/pipeline.py [--quick] [--models NAME ...] [--out benchmarks/results]

The paper's nine models at the simulated testbed's strong-scaling batch (analytical costs,
``benchmarks/simulated.py``'s set-up) on 2, 4 and 8 V100s, each step replayed with one
transfer at a time per link direction:

- ``pipedream``: PipeDream's stages over 1, 2 and 4 micro-batches per device
  (``fastt.sched.placers.pipedream``);
- ``micro-batched``: the best model-graph list schedule (DPOS, HEFT, m-TOPO, m-ETF, m-SCT,
  one device) over the same micro-batches, every part of an op on its op's device;
- ``os-dpos, no pipelines``: OS-DPOS from the data-parallel and model graphs only;
- ``os-dpos``: OS-DPOS, which also starts from both of the above;
- ``data-parallel`` (ring all-reduce) and ``data-parallel-ps`` (TF-slim's layout).

A pipeline wins a row when the better of the first two is more than 1% faster than every
plan without micro-batches. Writes pipeline.json and pipeline.md.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import models as zoo_models  # noqa: E402
from benchmarks.common import previous_full_run, real_arguments, with_row, \
    write_json  # noqa: E402
from benchmarks.simulated import training_graph  # noqa: E402

from fastt.costs.source import StaticCosts  # noqa: E402
from fastt.errors import FasttError  # noqa: E402
from fastt.sched.sim.device_spec import parse  # noqa: E402
from fastt.sched.search.osdpos import Plan  # noqa: E402
from fastt.sched.search.planning import Planning, feasible  # noqa: E402
from fastt.sched.search.starts import micro_batched_plans  # noqa: E402
from fastt.sched.registry import KINDS  # noqa: E402
from fastt.sched.strategy import plan  # noqa: E402

SPECS = ("2xV100", "4xV100", "8xV100")
PLANNED = ("pipedream", "data-parallel", "data-parallel-ps")
PIPELINES = ("pipedream", "micro-batched")
FLAT = ("os-dpos, no pipelines", "data-parallel", "data-parallel-ps")


def micro_batched(shared: Planning) -> tuple[float, str]:
    """The best model-graph list schedule over micro-batches: its simulated step, and how."""
    g = shared.graph
    p = shared.compile(g)
    kinds = [k for k in KINDS.values() if k.starts == "model" and k.starts_search]
    kinds.append(KINDS["dpos"])
    best = min(feasible([lambda k=k: (shared.place(k, g), k.name) for k in kinds]),
               key=lambda sk: sk[0].makespan)
    cands = micro_batched_plans(shared, Plan(g, p, best[0]))
    plan_, m = min(cands, key=lambda pm: shared.replay(pm[0].problem, pm[0].schedule)[1])
    return shared.replay(plan_.problem, plan_.schedule)[1], \
        f"{best[1]} over {m} micro-batches: {plan_.schedule.note}"


def case(graph, fetch, seconds, spec: str) -> dict:
    ds = parse(spec)
    costs = StaticCosts(seconds, ds)
    steps: dict[str, float | None] = {}
    notes: dict[str, str] = {}
    shared = Planning(graph, ds.devices, costs, ds.copy_bytes_per_s, fetch)
    for name in PLANNED + ("os-dpos",):
        try:
            s = plan(graph, ds.devices, costs, name, shared=shared, workers=2)
            steps[name], notes[name] = s.simulated_step_time_s, s.note
        except FasttError as e:
            steps[name], notes[name] = None, str(e)
    try:
        steps["micro-batched"], notes["micro-batched"] = micro_batched(shared)
    except FasttError as e:
        steps["micro-batched"], notes["micro-batched"] = None, str(e)
    flat = Planning(graph, ds.devices, costs, ds.copy_bytes_per_s, fetch)
    flat.pipelines = False
    steps["os-dpos, no pipelines"] = plan(graph, ds.devices, costs, "os-dpos", shared=flat,
                                          workers=2).simulated_step_time_s
    best_pipe = min((steps[k] for k in PIPELINES if steps[k] is not None), default=None)
    best_flat = min(steps[k] for k in FLAT if steps[k] is not None)
    return {"devices": spec, "step_s": steps, "notes": notes,
            "pipeline_over_best_flat": best_flat / best_pipe if best_pipe else None}


def markdown(doc: dict, level: str = "#") -> str:
    cols = ("pipedream", "micro-batched", "os-dpos", "os-dpos, no pipelines",
            "data-parallel", "data-parallel-ps")
    lines = [f"{level} Pipelines (simulated V100s, strong scaling)", "",
             "Simulated step time (ms), one transfer at a time per link direction. "
             "`gain`: the best flat plan (OS-DPOS without pipelines, both data-parallel "
             "layouts) over the better pipeline; above 1.01 the pipeline wins the row. "
             "`OS-DPOS gain`: OS-DPOS without pipelines over OS-DPOS (what starting from "
             "them gives it).", "",
             "| model | GPUs | " + " | ".join(cols) + " | gain | OS-DPOS gain |",
             "|---|---|" + "---:|" * (len(cols) + 2)]
    wins: list[str] = []
    helped: list[str] = []
    for m in doc["models"]:
        for r in m["rows"]:
            step = r["step_s"]
            cells = [f"{1e3 * step[c]:.2f}" if step.get(c) is not None else "n/a"
                     for c in cols]
            gain = r["pipeline_over_best_flat"]
            own = step["os-dpos, no pipelines"] / step["os-dpos"] if step.get("os-dpos") \
                else None
            lines.append(f"| {m['model']} | {r['devices']} | " + " | ".join(cells) +
                         (f" | {gain:.3f}" if gain else " | n/a") +
                         (f" | {own:.3f} |" if own else " | n/a |"))
            if own and own > 1.01:
                helped.append(f"- {m['model']} on {r['devices']}: {own:.2f}x "
                              f"({r['notes']['os-dpos'] or 'no note'})")
            if gain and gain > 1.01:
                which = min((k for k in PIPELINES if step.get(k) is not None),
                            key=lambda k: step[k])
                wins.append(f"- {m['model']} on {r['devices']}: {gain:.2f}x, {which} "
                            f"({r['notes'][which]})")
    lines += ["", "Where a pipeline wins:", ""] + (wins or ["- nowhere"])
    lines += ["", "Where OS-DPOS is faster for starting from them:", ""] + (
        helped or ["- nowhere"])
    return "\n".join(lines) + "\n"


def main() -> None:
    args = real_arguments(__doc__)  # --steps and --repeats are not used here
    names = [m.name for m in zoo_models.SIMULATED]
    pick = zoo_models.pick(zoo_models.SIMULATED, args.models or
                           (["lenet", "transformer"] if args.quick else None))
    path = os.path.join(args.out, "pipeline.json")
    doc = previous_full_run(path) if not args.quick else None
    doc = doc or {"meta": {"quick": args.quick}, "models": []}
    os.makedirs(args.out, exist_ok=True)
    for model in pick:
        graph, fetch, seconds = training_graph(model, model.batch)
        rows = []
        for spec in SPECS[:2] if args.quick else SPECS:
            rows.append(case(graph, fetch, seconds, spec))
            r = rows[-1]
            print(f"{model.name:>12} {spec}: " + ", ".join(
                f"{k} {1e3 * v:.1f}" for k, v in r["step_s"].items() if v is not None) +
                f"; gain {r['pipeline_over_best_flat'] or 0:.3f}", flush=True)
        doc["models"] = with_row(doc["models"], {"model": model.name, "batch": model.batch,
                                                 "rows": rows}, names)
        write_json(path, doc)
    with open(os.path.join(args.out, "pipeline.md"), "w", encoding="utf-8") as f:
        f.write(markdown(doc))


if __name__ == "__main__":
    main()
