"""The per-step equivalence check over the zoo and the corpus: every strategy's first step
against the original graph's, tensor by tensor, against the tolerance of
``fastt.plugin.verify``.

    python benchmarks/verify_zoo.py [--out benchmarks/results] [--models-only|--corpus-only]
                                    [NAME ...]

The zoo's nine models are trained by the session plugin on 2 logical CPU devices (float32, a
small batch, ``STEPS`` steps; each in a process of its own); each script of the corpus
(``tests/scripts/``) runs unchanged under ``fastt verify``. Per run: each check (strategy,
step, tensors compared, the largest relative difference and where) and whether any differs.
Writes verify_zoo.json and verify_zoo.md.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
# The paper's models as the zoo has them, small inputs (what the rewriter's tests train).
MODELS = {
    "mlp": ("sgd", {"batch_size": 8}),
    "small_cnn": ("momentum", {"batch_size": 8, "batch_norm": True}),
    "lenet": ("adam", {"batch_size": 8}),
    "alexnet_v2": ("sgd", {"batch_size": 4, "image_size": 96}),
    "vgg_16": ("momentum", {"batch_size": 4, "image_size": 32}),
    "inception_v3": ("adam", {"batch_size": 4, "image_size": 107}),
    "resnet_v2_50": ("momentum", {"batch_size": 4, "image_size": 64, "learning_rate": 1e-3}),
    "transformer": ("adam", {"layers": 1, "batch_size": 4}),
    "lstm_lm": ("sgd", {"batch_size": 8}),
}
STEPS = 60
CORPUS = sorted(glob.glob(os.path.join(ROOT, "tests", "scripts", "*.py")))
# Corpus scripts run with settings of their own (as tests/test_scripts.py runs them).
SETTINGS = {"wide_mlp_adam.py": {"FASTT_DEVICE_MEMORY_MB": "60"}}


def one(name: str, report: str) -> None:
    """Train zoo model ``name`` under the plugin, each check appended to ``report``."""
    import tensorflow as tf

    import fastt.plugin
    from fastt import zoo
    from fastt.plugin.settings import Settings, parse_devices
    tf.compat.v1.disable_eager_execution()
    opt, kwargs = MODELS[name]
    devices, cpus = parse_devices("cpu:2")
    fastt.plugin.install(Settings(enabled=True, devices=devices, logical_cpus=cpus,
                                  warmup_steps=2, profile_steps=1, measure_steps=3,
                                  measure_seconds=0.0, max_rounds=2, verify=True,
                                  verify_report=report, overhead_fraction=float("inf"),
                                  overhead_s=float("inf")))
    m = zoo.build(name, opt=opt, **kwargs)
    with tf.compat.v1.Session(graph=m.graph) as sess:
        sess.run(m.init)
        for _ in range(STEPS):
            sess.run(m.train_op, m.feed_dict())


def _checks(report: str) -> list[dict[str, Any]]:
    """Each check of ``report``, its tensors reduced to the largest difference."""
    from fastt.plugin.verify import read
    from fastt.verify_cmd import _largest
    out = []
    for c in read(report):
        worst = _largest(c)
        out.append({"strategy": c["strategy"], "step": c.get("step"), "skipped": c["skipped"],
                    "differs": bool(c["verdict"]), "tensors": len(c["tensors"]),
                    "largest": None if worst is None else
                    {k: worst[k] for k in ("name", "kind", "relative", "tolerance")}})
    return out


def run(kind: str, name: str, env: dict[str, str]) -> dict[str, Any]:
    """One model (``kind`` "model") or corpus script (``kind`` "script") under the check."""
    with tempfile.TemporaryDirectory(prefix="fastt-verify-zoo-") as tmp:
        report = os.path.join(tmp, "checks.jsonl")
        if kind == "model":
            argv = [sys.executable, __file__, "--one", name, "--report", report]
            child = env
        else:
            argv = [sys.executable, "-m", "fastt.cli", "verify", "--json",
                    os.path.join(tmp, "checks.json"), name, "--out", os.path.join(tmp, "out")]
            child = {**env, **SETTINGS.get(os.path.basename(name), {})}
        began = time.perf_counter()
        p = subprocess.run(argv, env=child, cwd=tmp, capture_output=True, text=True,
                           timeout=1800)
        seconds = round(time.perf_counter() - began, 1)
        if kind == "script":
            doc = json.load(open(os.path.join(tmp, "checks.json"))) \
                if os.path.exists(os.path.join(tmp, "checks.json")) else {"checks": []}
            with open(report, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(c) + "\n" for c in doc["checks"])
        checks = _checks(report)
    row = {"kind": kind, "name": os.path.relpath(name, ROOT) if kind == "script" else name,
           "exit_code": p.returncode, "seconds": seconds, "checks": checks}
    if kind == "model" and p.returncode != 0 or kind == "script" and p.returncode not in (0, 1, 3):
        row["error"] = (p.stderr.strip().splitlines() or ["?"])[-1]
    return row


def _share(t: dict[str, Any]) -> float:
    """A tensor's difference as a share of its tolerance (inf: beyond any)."""
    r, tol = t["relative"], t["tolerance"]
    if r is None:
        return float("inf")
    return r / tol if tol > 0 else (float("inf") if r > 0 else 0.0)


def _rel(r: float | None) -> str:
    return "unequal" if r is None else f"{r:.2g}"


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    checked = [c for r in rows for c in r["checks"] if not c["skipped"]]
    largest = max((_share(c["largest"]) for c in checked if c["largest"]), default=0.0)
    lines = ["# The per-step check over the zoo and the corpus", "",
             f"{meta['date']}, {meta['machine']}; {meta['seconds']:.0f} s. Each strategy's "
             "first step run again on the original graph from the same state on the same "
             "batch; the largest difference over all fetched values and variables, relative "
             "to the tensor's largest magnitude, against the dtype's tolerance (float32 "
             "1e-4; a variable Adam drives with rounding noise: twice its step, tolerance 1; "
             "`fastt/plugin/verify.py`). Zoo models: 2 logical CPU devices, "
             f"{STEPS} steps; corpus: `fastt verify tests/scripts/NAME.py`.", "",
             f"{len(checked)} checks on {len(rows)} runs; "
             f"{sum(c['differs'] for c in checked)} beyond tolerance; "
             f"largest difference {largest:.2g} of its tolerance.",
             "", "| run | checks | strategies (step) | tensors | largest difference (where) | "
             "result |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        cs = [c for c in r["checks"] if not c["skipped"]]
        worst = max((c for c in cs if c["largest"]), default=None,
                    key=lambda c: _share(c["largest"]))
        where = "-" if worst is None else \
            f"{_rel(worst['largest']['relative'])} of {worst['largest']['tolerance']:g} " \
            f"({worst['largest']['kind']} `{worst['largest']['name']}`)"
        skipped = [c for c in r["checks"] if c["skipped"]]
        result = r.get("error") or ("DIFFERS" if any(c["differs"] for c in cs) else
                                    "within" if cs else "no strategy activated")
        if skipped:
            result += f"; {len(skipped)} not checked ({skipped[0]['skipped']})"
        which = ", ".join(f"{c['strategy']} ({c['step']})" for c in cs) or "-"
        lines.append(f"| {r['name']} | {len(cs)} | {which} | "
                     f"{sum(c['tensors'] for c in cs)} | {where} | {result} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("names", nargs="*", help="models or corpus scripts (default: all)")
    ap.add_argument("--out", default="")
    ap.add_argument("--models-only", action="store_true")
    ap.add_argument("--corpus-only", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--report", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        one(args.one, args.report)
        return 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTT")}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
    todo = [] if args.corpus_only else [("model", m) for m in MODELS
                                        if not args.names or m in args.names]
    todo += [] if args.models_only else [
        ("script", s) for s in CORPUS
        if not args.names or os.path.basename(s).removesuffix(".py") in args.names]
    began, rows = time.perf_counter(), []
    for kind, name in todo:
        rows.append(run(kind, name, env))
        r = rows[-1]
        print(f"{r['name']:40s} {r['seconds']:6.1f} s  " + (r.get("error") or "; ".join(
            f"{c['strategy']}: " + (f"not checked ({c['skipped']})" if c["skipped"] else
                                    f"{'DIFFERS' if c['differs'] else 'within'} "
                                    f"{_rel(c['largest']['relative']) if c['largest'] else ''}")
            for c in r["checks"]) or "no strategy activated"), flush=True)
    meta = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, "
            f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
            "seconds": time.perf_counter() - began, "steps": STEPS}
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "verify_zoo.json"), "w", encoding="utf-8") as f:
            json.dump({**meta, "results": rows}, f, indent=1)
        with open(os.path.join(args.out, "verify_zoo.md"), "w", encoding="utf-8") as f:
            f.write(markdown(rows, meta))
    ok = all(not r.get("error") and r["checks"] and not any(c["differs"] for c in r["checks"])
             for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
