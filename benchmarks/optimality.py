"""How far the placers are from the optimum: the exact program against the list schedulers.

    python benchmarks/optimality.py [--quick] [--time-limit S] [--out benchmarks/results]

Small graphs, two kinds: random layered DAGs (10-18 ops, random op and transfer times, on 2-4
devices, identical or not) and real models coarsened (LeNet, AlexNet and VGG-19's training
steps on simulated V100s, TensorFlow's analytical op times, ops merged by name scope: a
layer's forward ops, its gradient ops; cycles the merge makes are merged too). On each, the
exact program (``fastt.sched.placers.exact``, HiGHS) gives the optimal makespan under DPOS's model
of a step (links without contention), and each placer's makespan under the same model is set against
it: DPOS, HEFT, m-TOPO, m-ETF, m-SCT, and OS-DPOS (on these graphs no op has a split rule, so
OS-DPOS is the plan it would pick among its starting points: the fastest with one transfer at a time
per link). DPOS's guarantee is checked on each graph: ``omega_DPOS <= 2 omega_opt +
C_max``, with ``omega_opt`` the optimum with free transfers (the exact program again, or its
lower bound when the time limit stops it) and ``C_max`` the dearest chain of transfers.
Writes optimality.json and optimality.md.
"""
from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import machine  # noqa: E402
from fastt.errors import FasttError  # noqa: E402
from fastt.sched import Device, Problem, dpos  # noqa: E402
from fastt.sched.placers import baselines  # noqa: E402
from fastt.sched.search.bounds import c_max  # noqa: E402
from fastt.sched.placers.exact import solve  # noqa: E402
from fastt.sched.search.planning import replay_schedule  # noqa: E402

PLACERS = {"DPOS": dpos, "HEFT": baselines.heft, "m-TOPO": baselines.m_topo,
           "m-ETF": baselines.m_etf, "m-SCT": baselines.m_sct, "single": baselines.single}


def layered(rnd: random.Random, k: int) -> tuple[str, Problem]:
    """A random layered DAG: 3-6 layers of 2-5 ops, each op fed by 1-3 ops of the layer
    before; op times 1-10 ms (per device when the devices differ), transfers 0.1-8 ms."""
    layers = [list(range(w)) for w in (rnd.randint(2, 5) for _ in range(rnd.randint(3, 6)))]
    ids, n = [], 0
    for layer in layers:
        ids.append(list(range(n, n + len(layer))))
        n += len(layer)
    n = min(n, 18)
    edges = []
    for before, now in zip(ids, ids[1:]):
        for j in now:
            for i in rnd.sample(before, min(len(before), rnd.randint(1, 3))):
                if i < n and j < n:
                    edges.append((i, j, rnd.uniform(1e5, 8e6)))
    D = rnd.randint(2, 4)
    same = rnd.random() < 0.5
    w = [[rnd.uniform(1e-3, 10e-3)] * D if same else
         [rnd.uniform(1e-3, 10e-3) for _ in range(D)] for _ in range(n)]
    kind = "identical" if same else "unrelated"
    return (f"layered-{k} ({kind})",
            Problem.build(n, edges, w, [Device(f"/device:GPU:{d}") for d in range(D)],
                          intercept=1e-4, slope=1e-9))


def coarsened(model: str, spec: str) -> tuple[str, Problem]:
    """A zoo model's training step on ``spec``, its ops merged by name scope."""
    import networkx as nx

    from benchmarks import models as zoo_models
    from benchmarks.simulated import training_graph
    from fastt.costs.source import StaticCosts
    from fastt.sched.sim.device_spec import parse
    from fastt.sched.search.osdpos import compiler
    m = zoo_models.pick(zoo_models.SIMULATED, [model])[0]
    graph, fetch, seconds = training_graph(m, m.batch)
    ds = parse(spec)
    step = graph.fan_in(fetch)
    p = compiler(ds.devices, StaticCosts(seconds, ds), step)(step)

    tops = [n.split("/")[0] for n in p.names if not n.startswith("gradients/")]
    # tf-slim nets put every layer under the net's own scope
    depth = 2 if max(map(tops.count, set(tops))) > len(tops) / 2 else 1

    def scope(name: str) -> str:
        grad = name.startswith("gradients/")
        parts = name.split("/")[1 if grad else 0:]
        return ("gradients/" if grad else "") + "/".join(parts[:depth])
    g = nx.DiGraph()
    g.add_nodes_from(range(p.n))
    g.add_edges_from((i, j) for i in range(p.n) for j, _ in p.succs[i])
    key = {i: scope(p.names[i]) for i in range(p.n)}
    merged = nx.DiGraph()
    merged.add_nodes_from(set(key.values()))
    merged.add_edges_from((key[i], key[j]) for i, j in g.edges if key[i] != key[j])
    dag = nx.condensation(merged)  # scopes on a cycle become one node
    node = {i: dag.graph["mapping"][key[i]] for i in range(p.n)}
    order = list(nx.topological_sort(dag))
    index = {c: k for k, c in enumerate(order)}
    D = p.num_devices
    w = [[0.0] * D for _ in order]
    for i in range(p.n):
        for d in range(D):
            w[index[node[i]]][d] += p.w[i][d]
    nbytes: dict[tuple[int, int], float] = defaultdict(float)
    for i in range(p.n):
        for j, e in p.succs[i]:
            a, b = index[node[i]], index[node[j]]
            if a != b:
                nbytes[(a, b)] += p.edge_bytes[e]
    names = [" + ".join(sorted(dag.nodes[c]["members"]))[:60] for c in order]
    q = Problem.build(len(order), [(a, b, v) for (a, b), v in nbytes.items()], w, ds.devices,
                      intercept=p.intercept, slope=p.slope, names=names)
    return f"{model} coarsened ({spec})", q


def case(name: str, p: Problem, time_limit: float) -> dict:
    t = time.perf_counter()
    opt = solve(p, time_limit)
    free = Problem.build(p.n, [(m, j, 0.0) for j in range(p.n) for m, _ in p.preds[j]], p.w,
                         p.devices)
    opt_free = solve(free, time_limit)
    row: dict = {"graph": name, "ops": p.n, "devices": p.num_devices,
                 "exact_s": opt.schedule.makespan, "optimal": opt.optimal, "gap": opt.gap,
                 "lower_bound_s": opt.lower_bound, "exact_time_s": opt.seconds,
                 "placers": {}}
    replays = {}
    for label, placer in PLACERS.items():
        try:
            s = placer(p)
        except FasttError as e:
            row["placers"][label] = {"error": str(e)}
            continue
        replays[label] = replay_schedule(p, s)
        row["placers"][label] = {"makespan_s": replays[label][0]}
    # OS-DPOS with nothing to split: of its starting plans, the fastest with one transfer at
    # a time per link (ties: the contention-free one)
    pick = min(replays, key=lambda k: (replays[k][1], replays[k][0]))
    row["placers"]["OS-DPOS"] = {"makespan_s": replays[pick][0], "picked": pick}
    best = opt.lower_bound if opt.optimal else opt.schedule.makespan
    for r in row["placers"].values():
        if "makespan_s" in r:
            r["over_optimum"] = r["makespan_s"] / best if opt.optimal else None
    omega_dpos = row["placers"]["DPOS"]["makespan_s"]
    row["theorem"] = {"omega_dpos_s": omega_dpos, "omega_opt_free_s": opt_free.lower_bound
                      if not opt_free.optimal else opt_free.schedule.makespan,
                      "omega_opt_free_proven": opt_free.optimal, "c_max_s": c_max(p)}
    th = row["theorem"]
    th["bound_s"] = 2 * th["omega_opt_free_s"] + th["c_max_s"]
    th["holds"] = omega_dpos <= th["bound_s"] + 1e-12
    row["wall_s"] = time.perf_counter() - t
    return row


def markdown(doc: dict, level: str = "#") -> str:
    """The table and the summary of ``doc`` (optimality.json), under a heading of ``level``."""
    labels = ["DPOS", "OS-DPOS", "HEFT", "m-TOPO", "m-ETF", "m-SCT", "single"]
    lines = [f"{level} Distance to the optimum (exact program, HiGHS)", "",
             f"Machine: {doc['meta']['machine']}; {doc['meta']['when']}; time limit "
             f"{doc['meta']['time_limit_s']:.0f} s per program.", "",
             "Makespans under DPOS's model of a step (links without contention); each placer's "
             "as a ratio to the optimum (1.00: optimal). `n/a`: the placer did not fit or the "
             "optimum was not proven. Theorem: DPOS's makespan against 2 omega_opt + C_max.", "",
             "| graph | ops | devices | optimum (ms) | " + " | ".join(labels) +
             " | DPOS (ms) | 2 omega_opt + C_max (ms) | holds |",
             "|---|---:|---:|---:|" + "---:|" * len(labels) + "---:|---:|---|"]
    for r in doc["rows"]:
        cells = []
        for k in labels:
            v = r["placers"].get(k, {}).get("over_optimum")
            cells.append("n/a" if v is None else f"{v:.2f}")
        opt = f"{1e3 * r['exact_s']:.2f}" + ("" if r["optimal"] else
                                             f" (gap {100 * r['gap']:.0f}%)")
        th = r["theorem"]
        lines.append(f"| {r['graph']} | {r['ops']} | {r['devices']} | {opt} | " +
                     " | ".join(cells) + f" | {1e3 * th['omega_dpos_s']:.2f} | "
                     f"{1e3 * th['bound_s']:.2f} | {'yes' if th['holds'] else 'NO'} |")
    lines.append("")
    for k in labels:
        gaps = [r["placers"][k]["over_optimum"] - 1 for r in doc["rows"]
                if r["placers"].get(k, {}).get("over_optimum") is not None]
        if gaps:
            lines.append(f"- {k}: median gap {100 * statistics.median(gaps):.1f}%, worst "
                         f"{100 * max(gaps):.1f}%, optimal on {sum(g < 1e-6 for g in gaps)} "
                         f"of {len(gaps)} graphs")
    held = [r["theorem"]["holds"] for r in doc["rows"]]
    lines += [f"- DPOS's guarantee holds on {sum(held)} of {len(held)} graphs", ""]
    return "\n".join(lines)


def main() -> None:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="six random graphs, no real model")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per program")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    rnd = random.Random(2020)
    graphs = [layered(rnd, k) for k in range(6 if args.quick else 16)]
    if not args.quick:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        graphs += [coarsened(m, spec) for m in ("lenet", "alexnet", "vgg_19")
                   for spec in ("2xV100", "4xV100")]
    doc = {"meta": {"machine": machine(),
                    "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "time_limit_s": args.time_limit, "quick": args.quick}, "rows": []}
    for name, p in graphs:
        row = case(name, p, args.time_limit)
        doc["rows"].append(row)
        print(f"{name:>36}: {p.n:3d} ops on {p.num_devices}: optimum "
              f"{1e3 * row['exact_s']:8.2f} ms{'' if row['optimal'] else ' (not proven)'}, "
              f"DPOS x{row['placers']['DPOS'].get('over_optimum') or float('nan'):.3f}, "
              f"theorem {'holds' if row['theorem']['holds'] else 'FAILS'} "
              f"({row['wall_s']:.1f} s)", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "optimality.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(args.out, "optimality.md"), "w", encoding="utf-8") as f:
        f.write(markdown(doc))


if __name__ == "__main__":
    main()
