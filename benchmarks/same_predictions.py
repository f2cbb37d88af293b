"""The predicted step of every strategy, zoo model and device set, so that a change meant to
leave planning alone (a restructuring, a speed-up) can be shown to predict the same steps.

    python benchmarks/same_predictions.py --out BEFORE.json [--models NAME ...] [--devices SPEC ...]
    python benchmarks/same_predictions.py --compare BEFORE.json AFTER.json

Each model (``models.SIMULATED`` at its batch, TensorFlow's analytical V100 op times) is planned
in a process of its own, every registered strategy but the time-limited ``exact`` one, with no
deadline and OS-DPOS's search on one process. OS-DPOS's split search stops at its own budget
(``--search-budget`` sets another), as does the search for hybrid layouts it may start from,
and near a budget a candidate is skipped or not by the clock; so a strategy's prediction is
compared only where its searches finished in both runs well within their budgets (the others
are listed).
``--compare`` prints one line per row that differs and exits 1 when any does.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import models as zoo_models  # noqa: E402
from benchmarks.common import machine  # noqa: E402

DEVICES = ("2xV100", "4xV100", "2x4xV100")
REL_TOL = 1e-9  # the same arithmetic in the same order: equal but for float printing


class _Stopped(logging.Handler):
    """Notes that a search stopped at its budget (OS-DPOS's split search, or the hybrid
    layouts' search its starting points come from)."""

    def __init__(self) -> None:
        super().__init__()
        self.stopped = False

    def emit(self, record: logging.LogRecord) -> None:
        self.stopped |= "stopped at its" in record.getMessage()


def model_rows(name: str, specs: list[str], search_budget_s: float | None = None
               ) -> list[dict]:
    """Every strategy's predicted step of model ``name`` on each of ``specs``; OS-DPOS's
    search within ``search_budget_s`` (None: its own budget)."""
    import time

    from fastt.sched import strategy
    from benchmarks.simulated import training_graph
    from fastt.costs.source import StaticCosts
    from fastt.errors import FasttError
    from fastt.plan_cmd import Setup
    from fastt.sched.registry import kind, names
    from fastt.sched.sim.device_spec import parse
    from fastt.sched.strategy import plan
    own = strategy.BUDGET_S if search_budget_s is None else search_budget_s
    strategy.BUDGET_S = own
    logging.getLogger("fastt").setLevel(logging.INFO)  # the searches say so when they stop
    model = next(m for m in zoo_models.SIMULATED if m.name == name)
    graph, fetch, seconds = training_graph(model, model.batch)
    rows = []
    for spec in specs:
        ds = parse(spec)
        setup = Setup(graph, spec, ds, fetch, StaticCosts(seconds, ds))
        row: dict = {"model": name, "devices": spec, "ops": len(graph), "steps": {}}
        for n in names():
            if kind(n).timed:
                continue
            watch = _Stopped()
            logging.getLogger("fastt").addHandler(watch)
            t0 = time.perf_counter()
            try:
                s = plan(graph, ds.devices, setup.costs, n, ds.copy_bytes_per_s,
                         fetches=fetch, shared=setup.planning)
                # within the last tenth of its budget a candidate may be skipped unsaid
                near = kind(n).search and time.perf_counter() - t0 > 0.9 * own
                row["steps"][n] = {"predicted_s": s.predicted_step_time_s,
                                   "simulated_s": s.simulated_step_time_s,
                                   "search_stopped": watch.stopped or near}
            except FasttError as e:
                row["steps"][n] = {"error": str(e)}
            finally:
                logging.getLogger("fastt").removeHandler(watch)
        rows.append(row)
    return rows


def compare(before: dict, after: dict) -> list[str]:
    """What differs between two runs, one line each; empty when every prediction is equal."""
    def key(r: dict) -> tuple[str, str]:
        return r["model"], r["devices"]
    old = {key(r): r for r in before["rows"]}
    new = {key(r): r for r in after["rows"]}
    out = [f"{m} on {d}: only in the first run" for m, d in old.keys() - new.keys()]
    out += [f"{m} on {d}: only in the second run" for m, d in new.keys() - old.keys()]
    for k in sorted(old.keys() & new.keys()):
        a, b = old[k]["steps"], new[k]["steps"]
        for n in sorted(a.keys() | b.keys()):
            x, y = a.get(n, {}), b.get(n, {})
            if x.get("search_stopped") or y.get("search_stopped"):
                continue
            if "error" in x or "error" in y:
                if x.get("error") != y.get("error"):
                    out.append(f"{k[0]} on {k[1]}, {n}: {x.get('error')!r} / {y.get('error')!r}")
                continue
            for field in ("predicted_s", "simulated_s"):
                p, q = x.get(field), y.get(field)
                if p is None or q is None or abs(p - q) > REL_TOL * max(abs(p), abs(q)):
                    out.append(f"{k[0]} on {k[1]}, {n}: {field} {p} / {q}")
    return out


def summary(before: dict, after: dict) -> str:
    """How many predictions were compared, and which OS-DPOS searches stopped."""
    compared = stopped = 0
    stops = []
    for r in after["rows"]:
        b = next((x for x in before["rows"]
                  if (x["model"], x["devices"]) == (r["model"], r["devices"])), None)
        if b is None:
            continue
        for n, v in r["steps"].items():
            if v.get("search_stopped") or b["steps"].get(n, {}).get("search_stopped"):
                stopped += 1
                stops.append(f"{n}, {r['model']} on {r['devices']}")
            else:
                compared += 1
    line = f"{compared} predictions compared over {len(after['rows'])} rows"
    if stops:
        line += f"; {stopped} left out, a search stopped at its budget ({'; '.join(stops)})"
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="*", default=[m.name for m in zoo_models.SIMULATED])
    ap.add_argument("--devices", nargs="*", default=list(DEVICES))
    ap.add_argument("--out", default=None)
    ap.add_argument("--compare", nargs=2, default=None)
    ap.add_argument("--search-budget", type=float, default=None,
                    help="seconds OS-DPOS's split search may take (default: its own)")
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)  # child process
    args = ap.parse_args()
    if args.compare:
        before, after = (json.load(open(p)) for p in args.compare)
        diff = compare(before, after)
        print("\n".join(diff) if diff else "every prediction equal")
        print(summary(before, after))
        sys.exit(1 if diff else 0)
    if args.model:
        print(json.dumps(model_rows(args.model, args.devices, args.search_budget)))
        return
    if not args.out:
        ap.error("--out FILE or --compare A B")
    rows = []
    for name in args.models:
        budget = [] if args.search_budget is None else ["--search-budget",
                                                        str(args.search_budget)]
        p = subprocess.run([sys.executable, __file__, "--model", name, *budget, "--devices",
                            *args.devices], capture_output=True, text=True, check=True)
        rows += json.loads(p.stdout.strip().splitlines()[-1])
        print(f"{name}: done", file=sys.stderr)
    with open(args.out, "w") as f:
        json.dump({"machine": machine(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
