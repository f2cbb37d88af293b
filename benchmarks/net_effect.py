"""fastt's net effect on the user's own run: wall time with and without ``FASTT=1``.

    python benchmarks/net_effect.py [--quick] [--repeats 3] [--out benchmarks/results]

Each row is an unchanged script of the examples and the corpus at one length, from 50 steps to
about 5 minutes, run as a user runs it: ``python script.py`` and ``FASTT=1
FASTT_DEVICES=cpu:2 python script.py`` with fastt's defaults (its overhead budget on, the plan
cache off for these first runs), alternated ``--repeats`` times, each wall time from start to
exit. Per row: the median ratio of the pairs (fastt / plain), the graph fastt ended on, what it
said it spent. Then, where a first run kept a plan, the plan cache: a run that fills a fresh
cache and the run after it, with the step at which each reached its kept plan. Writes
net_effect.json and net_effect.md.
"""
from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS: list[tuple] = [  # (name, script, arguments[, fastt's settings])
    ("session_feed_dict, 50 steps", "examples/session_feed_dict.py", ["--steps", "50"]),
    ("slim_train, 150 steps", "examples/slim_train.py", ["--steps", "150"]),
    ("monitored_tf_data, 150 steps", "examples/monitored_tf_data.py", ["--steps", "150"]),
    ("keras_fit, 3 epochs", "examples/keras_fit.py", ["--epochs", "3"]),
    ("wide_mlp_adam, 60 steps", "tests/scripts/wide_mlp_adam.py", ["--steps", "60"]),
    ("dropout_random_input, 200 steps", "tests/scripts/dropout_random_input.py",
     ["--steps", "200"]),
    ("ensemble_two_models, 100 steps", "tests/scripts/ensemble_two_models.py",
     ["--steps", "100"]),
    ("dynamic_rnn_classifier", "tests/scripts/dynamic_rnn_classifier.py", []),
    ("session_feed_dict, 3000 steps", "examples/session_feed_dict.py", ["--steps", "3000"]),
    ("wide_mlp_adam, 1500 steps", "tests/scripts/wide_mlp_adam.py", ["--steps", "1500"]),
    ("session_feed_dict, 12000 steps", "examples/session_feed_dict.py", ["--steps", "12000"]),
    # devices told to hold less than the model: a model-parallel plan that fits is kept
    ("wide_mlp_adam, 1500 steps, 60 MB devices", "tests/scripts/wide_mlp_adam.py",
     ["--steps", "1500"], {"FASTT_DEVICE_MEMORY_MB": "60"}),
    # many devices: probing and planning stay within the same budget as on two
    ("session_feed_dict, 300 steps, 16 devices", "examples/session_feed_dict.py",
     ["--steps", "300"], {"FASTT_DEVICES": "cpu:16"}),
]
QUICK = ROWS[:2]
CACHE_TRIES = 3  # first runs made until one stores a plan
KEPT = re.compile(r"fastt: activated strategy \d+ \(([^)]*)\) at step (\d+)")
CLOSED = re.compile(r"session closed after (\d+) training steps on (.*?)(?:, [\d.]+x over the "
                    r"original)?; (\d+) strateg(?:y|ies) tried.*fastt's own cost ([\d.]+) s")
IN_WARMUP = "before the original graph's step time was measured"
COST = re.compile(r"fastt's own cost ([\d.]+) s")


def ended(x: dict) -> str:
    """Where a run with fastt ended (a session closed in its warm-up: the original graph)."""
    if x["ended_on"]:
        return x["ended_on"]
    return "the original graph (in its warm-up)" if any(IN_WARMUP in ln for ln in x["lines"]) \
        else "?"


def spent(x: dict) -> float:
    """What fastt said it spent, over every session of the run."""
    return sum(float(m.group(1)) for ln in x["lines"] if "session closed" in ln
               for m in [COST.search(ln)] if m)


def run(script: str, args: list[str], fastt: bool, out: str, cache: str | None = None,
        extra: dict | None = None) -> dict:
    """One run to its end: wall seconds, and what fastt said of it (``extra``: more of
    fastt's settings)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTT") and
           k != "TF_CONFIG"}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
    if fastt:
        env.update(FASTT="1", FASTT_DEVICES="cpu:2")
        env.update({"FASTT_CACHE_DIR": cache} if cache else {"FASTT_CACHE": "0"})
        env.update(extra or {})
    argv = [sys.executable, os.path.join(ROOT, script), *args]
    if "keras_fit" not in script:
        argv += ["--out", out]
    began = time.perf_counter()
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - began
    if p.returncode != 0:
        raise SystemExit(f"{script} failed ({'with' if fastt else 'without'} fastt):\n"
                         + p.stderr[-3000:])
    said = [ln for ln in p.stderr.splitlines() if ln.startswith("fastt:")]
    doc: dict = {"wall_s": wall}
    kept = [KEPT.search(ln) for ln in said]
    kept_at = [(m.group(1), int(m.group(2))) for m in kept if m]
    closing = [CLOSED.search(ln) for ln in said if "session closed" in ln]
    closing = [m for m in closing if m]
    if fastt:
        doc.update(
            kept=kept_at[-1][0] if kept_at else None,
            kept_at_step=kept_at[-1][1] if kept_at else None,
            ended_on=closing[-1].group(2) if closing else None,
            tried=sum(int(m.group(3)) for m in closing),
            spent_s=sum(float(m.group(4)) for m in closing),
            cached="from the plan cache" in "\n".join(said), lines=said[-6:])
    return doc


def bench(name: str, script: str, args: list[str], repeats: int, work: str,
          extra: dict | None = None) -> dict:
    pairs = []
    for r in range(repeats):
        order = (False, True) if r % 2 == 0 else (True, False)
        got = {f: run(script, args, f, os.path.join(work, f"{name}-{f}-{r}"), extra=extra)
               for f in order}
        pairs.append({"plain": got[False], "fastt": got[True]})
        print(f"  {name} #{r + 1}: plain {got[False]['wall_s']:.1f} s, fastt "
              f"{got[True]['wall_s']:.1f} s, ended on {got[True]['ended_on']}", flush=True)
    ratios = [p["fastt"]["wall_s"] / p["plain"]["wall_s"] for p in pairs]
    row = {"name": name, "script": script, "args": args, "settings": extra or {},
           "pairs": pairs,
           "ratio": statistics.median(ratios),
           "plain_s": statistics.median(p["plain"]["wall_s"] for p in pairs),
           "fastt_s": statistics.median(p["fastt"]["wall_s"] for p in pairs),
           "kept_plan": any(p["fastt"]["kept"] for p in pairs)}
    if row["kept_plan"]:
        # A run stores a plan only when it keeps one: first runs, each into a fresh cache
        # (one that kept nothing would store "the original graph"), until one does.
        for k in range(CACHE_TRIES):
            cache = tempfile.mkdtemp(prefix="fastt-net-cache-")
            first = run(script, args, True, os.path.join(work, f"{name}-c1-{k}"), cache, extra)
            if stored_plan(cache):
                break
        second = run(script, args, True, os.path.join(work, f"{name}-c2"), cache, extra)
        row["cache"] = {"first": first, "second": second, "first_runs": k + 1,
                        "stored": stored_plan(cache)}
        print(f"  {name} cache: kept at step {first['kept_at_step']} (first run {k + 1}), then "
              f"{second['kept_at_step']} (from the cache: {second['cached']})", flush=True)
    return row


def stored_plan(cache: str) -> bool:
    """Whether the plan cache in ``cache`` holds a kept plan (not only "the original")."""
    from fastt.plugin.cache import PlanCache
    return any(doc.get("strategy") is not None for _, doc in PlanCache(cache).entries())


def verdict(row: dict) -> str:
    """The acceptance of a row: a run that keeps the original graph costs at most 1.03x its
    wall time plus 2 s; one that keeps a plan is at least as fast, wall for wall."""
    if row["kept_plan"] and "FASTT_DEVICE_MEMORY_MB" in row.get("settings", {}):
        return "kept for memory"  # the original does not fit the devices as the user set them
    if row["kept_plan"]:
        return "ok" if row["fastt_s"] <= row["plain_s"] else "slower"
    return "ok" if row["fastt_s"] <= 1.03 * row["plain_s"] + 2.0 else "over"


def markdown(doc: dict, level: str = "#") -> str:
    meta = doc["meta"]
    lines = [f"{level} fastt's net effect on unchanged scripts", "",
             "Wall time from start to exit, median of each row's runs with and without "
             "`FASTT=1 FASTT_DEVICES=cpu:2`, alternated (fastt's defaults: overhead budget "
             "3% + 2 s; plan cache off for these runs); "
             f"{meta['platform']}, TensorFlow {meta['tensorflow']}, {meta['cores']} cores, load "
             f"average {meta['load']} at the start. Logical CPU devices share the process's "
             "cores, so a kept plan here is rare; the figures are what fastt costs when it "
             "finds nothing, and that it never keeps a slower graph. Target: a run ending on "
             "the original graph at most 1.03x + 2 s; a run keeping a plan no slower. A row "
             "with `FASTT_DEVICE_MEMORY_MB` tells fastt that each device holds less than the "
             "model: the original graph does not fit, and a plan that fits is kept even where "
             "it is slower.", "",
             "| script | runs | plain (s) | fastt (s) | ratio | ended on | tried | fastt's own "
             "cost (s) | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        f = [p["fastt"] for p in r["pairs"]]
        ends = sorted({ended(x) for x in f})
        lines.append(f"| {r['name']} | {len(r['pairs'])} | {r['plain_s']:.1f} | "
                     f"{r['fastt_s']:.1f} | "
                     f"{r['ratio']:.3f} | {'; '.join(ends)} | "
                     f"{statistics.median(x['tried'] for x in f):g} | "
                     f"{statistics.median(spent(x) for x in f):.2f} | {verdict(r)} |")
    cached = [r for r in doc["rows"] if "cache" in r]
    lines += ["", "The plan cache, where a first run kept a plan: the run that filled a fresh "
              "cache, and the next run, starting from it.", ""]
    if not cached:
        lines.append("No first run kept a plan, so no cache run was made.")
    else:
        lines += ["Target: the second run reaches the kept plan in at most 1/3 of the first "
                  "run's steps to it. A first run stores a plan only when it keeps one; up to "
                  f"{CACHE_TRIES} first runs were made, each into a fresh cache, until one did.",
                  "", "| script | first runs | first run: kept at step | wall (s) | second "
                  "run: kept at step | wall (s) | from the cache | steps, second / first |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in cached:
            a, b = r["cache"]["first"], r["cache"]["second"]
            share = f"{b['kept_at_step'] / a['kept_at_step']:.3f}" \
                if a["kept_at_step"] and b["kept_at_step"] is not None else "-"
            lines.append(f"| {r['name']} | {r['cache'].get('first_runs', 1)} | "
                         f"{a['kept_at_step']} | {a['wall_s']:.1f} | {b['kept_at_step']} | "
                         f"{b['wall_s']:.1f} | {b['cached']} | {share} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="two short rows, one repeat")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", nargs="*", help="row names to run (default: all)")
    ap.add_argument("--append", action="store_true",
                    help="add the rows run to net_effect.json's (replacing rows of the same name)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    import tensorflow as tf
    rows = QUICK if args.quick else [r for r in ROWS if not args.rows or r[0] in args.rows]
    if args.rows and len(rows) != len(args.rows):
        raise SystemExit(f"unknown rows; the rows are: {[r[0] for r in ROWS]}")
    repeats = 1 if args.quick else args.repeats
    meta = {"platform": platform.platform(), "tensorflow": tf.__version__,
            "cores": os.cpu_count(), "repeats": repeats, "quick": args.quick,
            "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "date": time.strftime("%Y-%m-%d")}
    with tempfile.TemporaryDirectory(prefix="fastt-net-") as work:
        doc = {"meta": meta, "rows": [bench(r[0], r[1], r[2], repeats, work, *r[3:])
                                      for r in rows]}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "net_effect.json")
    if args.append and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        names = {r["name"] for r in doc["rows"]}
        doc["rows"] = [r for r in old["rows"] if r["name"] not in names] + doc["rows"]
        doc["meta"] = {**old["meta"], "appended": [*old["meta"].get("appended", []),
                                                   dict(meta)]}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    text = markdown(doc)
    with open(os.path.join(args.out, "net_effect.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
