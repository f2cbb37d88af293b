"""``fastt plan`` end to end on the simulated testbed: graph build, analytical costs, every
strategy (OS-DPOS and the baselines), as ``fastt plan`` runs them; one process per row.

    python benchmarks/plan_time.py [--models NAME ...] [--devices SPEC ...]
                                   [--scaling strong|weak|held-out]
                                   [--repeats N] [--out benchmarks/results] [--profile DIR]

Target (issue [search], item 6): 60 s or less per row on a 2-core machine. Writes
plan_time.json and plan_time.md (rows of earlier runs kept unless re-run); with ``--repeats``
each row is run N times (a process each) and is its median run, every total kept; with
``--profile`` each row's cProfile statistics go to DIR/<model>-<spec>.prof.

``--scaling held-out``: the graphs of about 40k ops of ``models.HELD_OUT`` on 16 devices,
planned as a user's own graph is: saved as a MetaGraphDef first (not timed), then loaded from
that file, costed and planned as ``fastt plan FILE --devices SPEC`` does.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import models as zoo_models  # noqa: E402
from benchmarks.common import cpu_model, machine, timed_on  # noqa: E402
from benchmarks.simulated import STRONG, WEAK, gpus  # noqa: E402

TARGET_S = 60.0
PLANNED = {"strong": STRONG, "weak": WEAK, "held-out": zoo_models.HELD_OUT_DEVICES}
SPECS = list(dict.fromkeys(s for specs in PLANNED.values() for s in specs))  # rows' order


def _held_out(name: str) -> zoo_models.Model:
    return next(m for m in zoo_models.HELD_OUT if m.name == name)


def export(name: str, path: str) -> None:
    """Save held-out model ``name`` at its batch as a MetaGraphDef with its train op in the
    ``train_op`` collection (what ``fastt plan FILE`` reads)."""
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    built = _held_out(name).build()
    with built.graph.as_default():
        tf.compat.v1.add_to_collection("train_op", built.train_op)
        tf.compat.v1.train.export_meta_graph(filename=path, graph=built.graph)


def row(name: str, spec: str, scaling: str, budget_s: float | None = TARGET_S,
        path: str | None = None) -> dict:
    """One ``fastt plan`` of model ``name`` on ``spec`` with its ``--budget``, timed by
    phase; held out: of the MetaGraphDef at ``path``."""
    from benchmarks.simulated import model_graph
    from fastt.costs.source import StaticCosts
    from fastt.plan_cmd import Setup, load, plan_all, prepare, static_seconds_aside
    from fastt.sched.sim.device_spec import parse
    clock = time.perf_counter  # fastt.sched.search.osdpos.clock, which deadlines are read on
    t0 = clock()
    deadline = {} if budget_s is None else {"deadline": t0 + budget_s}
    gc.disable()  # as `fastt plan` runs (fastt.cli)
    if scaling == "held-out":
        assert path is not None
        graph = load(path, None, None)
        setup = prepare(graph, spec, **deadline)
        batch = _held_out(name).batch
    else:
        model = next(m for m in zoo_models.SIMULATED if m.name == name)
        batch = model.batch if scaling == "strong" else model.per_device_batch * gpus(spec)
        graph, fetch = model_graph(model, batch)
        ds = parse(spec)  # the costs as `fastt plan --model` has them: on a second core
        setup = Setup(graph, spec, ds, fetch,
                      StaticCosts(static_seconds_aside(graph, fetch, "V100"), ds), **deadline)
    t1 = clock()
    chosen, others = plan_all(setup)
    t2 = clock()
    times = {n: s.plan_time_s for n, s in others.items() if not isinstance(s, str)}
    times[chosen.name] = chosen.plan_time_s
    return {"model": name, "devices": spec, "scaling": scaling, "batch": batch,
            "budget_s": budget_s,
            "ops": len(graph), "load_s": t1 - t0, "strategies_s": t2 - t1, "total_s": t2 - t0,
            "os_dpos_s": chosen.plan_time_s, "plan_times_s": times,
            "os_dpos_step_s": chosen.simulated_step_time_s}


def kept_rows(path: str, cpu: str) -> list[dict]:
    """The rows of the run at ``path`` (none yet: none), when they were timed on processor
    ``cpu``: a new run keeps them unless it times them again. Rows of device sets the
    benchmark no longer plans over at their scaling (``PLANNED``: a testbed since replaced)
    are dropped."""
    old = json.load(open(path)) if os.path.exists(path) else {"rows": []}
    rows = old["rows"] if not old["rows"] or timed_on(old, cpu, path) else []
    return [r for r in rows if r["devices"] in PLANNED.get(r.get("scaling", "strong"), ())]


def markdown(doc: dict, heading: str = "#") -> str:
    """The table of ``plan_time.json`` (also a section of the benchmark report)."""
    rows = doc["rows"]
    within = sum(r["total_s"] <= TARGET_S for r in rows)
    lines = [f"{heading} `fastt plan` end to end", "",
             f"Machine: {doc['machine']}; {doc['when']}. `python benchmarks/plan_time.py`: "
             "graph build, analytical costs and every strategy, one process per row, with "
             f"`--budget`; target {TARGET_S:.0f} s or less per row ({within} of {len(rows)} "
             "rows here). Held-out rows (`--scaling held-out`): graphs of about 40k ops saved "
             "as a MetaGraphDef, then loaded from that file, costed and planned as `fastt "
             "plan FILE` does.", "",
             "| model | devices | scaling | ops | budget (s) | load + costs (s) | "
             "strategies (s) | OS-DPOS alone (s) | total (s) | within target | runs: "
             "totals (s), load average |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in rows:
        budget = "none" if r.get("budget_s") is None else f"{r['budget_s']:.0f}"
        runs = ", ".join(f"{t:.1f}" for t in r.get("totals_s", [])) + (
            f"; {max(r['load_averages']):.2f} at most" if r.get("load_averages") else "")
        lines.append(f"| {r['model']} | {r['devices']} | {r['scaling']} | {r['ops']} | "
                     f"{budget} | "
                     f"{r['load_s']:.1f} | {r['strategies_s']:.1f} | {r['os_dpos_s']:.1f} | "
                     f"{r['total_s']:.1f} | {'yes' if r['total_s'] <= TARGET_S else 'no'} | "
                     f"{runs or 'one'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--devices", nargs="*", default=None)
    ap.add_argument("--scaling", choices=("strong", "weak", "held-out"), default="strong")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    ap.add_argument("--profile", default=None)
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs per row (a process each); the row is the median run's")
    ap.add_argument("--budget", type=float, default=TARGET_S,
                    help="fastt plan's --budget (default 60; negative: none)")
    ap.add_argument("--row", nargs=3, default=None, help=argparse.SUPPRESS)  # child process
    ap.add_argument("--file", default=None, help=argparse.SUPPRESS)  # a held-out row's graph
    ap.add_argument("--export", nargs=2, default=None, help=argparse.SUPPRESS)  # child
    args = ap.parse_args()
    if args.export:
        export(*args.export)
        return
    if args.row:
        name, spec, scaling = args.row
        budget = None if args.budget < 0 else args.budget
        if args.profile:
            import cProfile
            prof = cProfile.Profile()
            result = prof.runcall(row, name, spec, scaling, budget, args.file)
            prof.dump_stats(os.path.join(args.profile, f"{name}-{spec}.prof"))
        else:
            result = row(name, spec, scaling, budget, args.file)
        print("ROW " + json.dumps(result), flush=True)
        return
    held_out = args.scaling == "held-out"
    zoo = zoo_models.HELD_OUT if held_out else zoo_models.SIMULATED
    names = [m.name for m in zoo_models.pick(zoo, args.models)]
    specs = args.devices or (zoo_models.HELD_OUT_DEVICES if held_out else
                             STRONG if args.scaling == "strong" else WEAK)
    path = os.path.join(args.out, "plan_time.json")
    cpu = cpu_model()
    done: dict[tuple[str, str, str], dict] = {
        (r["model"], r["devices"], r["scaling"]): r for r in kept_rows(path, cpu)}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            graph_file = os.path.join(tmp, f"{name}.meta")
            if held_out:  # saved once, in a process of its own (not timed)
                subprocess.run([sys.executable, __file__, "--export", name, graph_file],
                               check=True, capture_output=True, env=env)
            for spec in specs:
                cmd = [sys.executable, __file__, "--row", name, spec, args.scaling,
                       "--budget", str(args.budget)]
                if held_out:
                    cmd += ["--file", graph_file]
                if args.profile:
                    os.makedirs(args.profile, exist_ok=True)
                    cmd += ["--profile", args.profile]
                runs = []
                for _ in range(args.repeats):
                    load = os.getloadavg()[0]
                    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
                    line = next((ln for ln in out.stdout.splitlines()
                                 if ln.startswith("ROW ")), None)
                    if line is None:
                        print(f"{name} {spec}: failed\n{out.stderr[-2000:]}", flush=True)
                        break
                    r = {**json.loads(line[4:]), "load_average": load}
                    runs.append(r)
                    print(f"{name:>12} {spec:>9}: load {r['load_s']:5.1f} s, strategies "
                          f"{r['strategies_s']:6.1f} s (os-dpos {r['os_dpos_s']:6.1f} s), total "
                          f"{r['total_s']:6.1f} s (1-minute load average {load:.2f})",
                          flush=True)
                if len(runs) == args.repeats:  # the run of the median total, with every total
                    r = sorted(runs, key=lambda x: x["total_s"])[(len(runs) - 1) // 2]
                    done[(name, spec, args.scaling)] = {
                        **r, "totals_s": [x["total_s"] for x in runs],
                        "load_averages": [x["load_average"] for x in runs]}
                    write(path, done, cpu)


def write(path: str, done: dict[tuple[str, str, str], dict], cpu: str) -> None:
    """plan_time.json and plan_time.md next to it, rows in the zoo's order."""
    meta = {"machine": machine(), "cpu": cpu,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    order = [m.name for m in zoo_models.SIMULATED + zoo_models.HELD_OUT]
    scalings = ["strong", "weak", "held-out"]
    rows = sorted(done.values(), key=lambda r: (
        order.index(r["model"]), scalings.index(r["scaling"]), SPECS.index(r["devices"])))
    with open(path, "w", encoding="utf-8") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)
    with open(os.path.join(os.path.dirname(path), "plan_time.md"), "w",
              encoding="utf-8") as f:
        f.write(markdown({**meta, "rows": rows}))


if __name__ == "__main__":
    main()
