"""Lost workers on a local 3-worker cluster: does the unchanged script run to its end?

    python benchmarks/faults.py [--quick] [--trials N] [--out benchmarks/results]

Each trial starts a 3-worker local cluster (127.0.0.1, one core each, 2 cores here: the
workers share them), runs ``benchmarks/scripts/elastic_mlp.py`` with ``FASTT=1`` on it and
kills one worker, chosen at random (the master's included), with SIGKILL (or SIGSTOP, the
``stop`` phase: a worker that stops answering, resumed 20 s later) at a random step of one
phase of fastt's work:

- ``warmup``: 1 to 6 steps after the training step was found (the script's own session
  runs);
- ``profile``: in the traced steps of the first round (no plan cached);
- ``activation``: the first 2 steps on the cached plan's new graph;
- ``kept``: 5 to 30 steps into the plan kept;
- ``stop``: SIGSTOP 5 to 30 steps into the plan kept.

The plan is data parallelism over the three workers, kept with ``FASTT_ROLLBACK=0`` (on two
shared cores it is slower than one worker, and would otherwise be rolled back: this
benchmark is about faults, not speed); a first run fills the plan cache so that the later
trials start on it without probing the links again. A trial is ``recovered`` when the script
exits 0 having printed every step once and in order; ``error`` when it ends in fastt's
``WorkerLostError``; ``failed`` otherwise, ``hung`` past its deadline. For recovered trials:
the time from the kill to the next step printed, and the largest relative difference of the
per-step losses from a run without fastt, before the kill (the data-parallel plan's
floating-point reassociation) and after it (a run that profiled re-plans over the workers
left: the new plan's reassociation; a run on the cached plan has no cost models to re-plan
with and goes on with the original graph on a worker left, from the state restored and
replayed value for value: any difference is the one training carried over).

The snapshots' cost (``overhead``): the same script on the cached plan, ``FASTT_ELASTIC`` on
and off alternately, the median step time of the steps after the plan is kept; the ratio of
the two, median over the repeats.

A worker that comes back (``comeback``, ``--comebacks`` runs): a small CNN on 2 workers, where
a plan over both beats one, worker 1 killed on the plan kept and restarted; whether the next
plan takes it in again, and the step times before, in between and after. Writes faults.json
and faults.md.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from benchmarks.common import machine, write_results  # noqa: E402
from fastt.cluster import LocalCluster  # noqa: E402

SCRIPT = os.path.join(HERE, "scripts", "elastic_mlp.py")
CNN = os.path.join(HERE, "scripts", "elastic_cnn.py")
PHASES = ("warmup", "profile", "activation", "kept", "stop")
STEP = re.compile(r"^step (\d+) loss (\S+) at (\S+)$", re.M)
DEADLINE_S = 420.0  # a trial past it is hung


def _env(cluster: LocalCluster, cache: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTT")}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1", FASTT="1",
               FASTT_CLUSTER=cluster.spec, FASTT_CACHE_DIR=cache, FASTT_OVERHEAD="off",
               FASTT_ROLLBACK="0", FASTT_MAX_ROUNDS="1", FASTT_STRATEGY="data-parallel",
               FASTT_LOG_LEVEL="DEBUG", **extra)
    return env


def _args(steps: int, out: str) -> list[str]:
    return [sys.executable, SCRIPT, "--steps", str(steps), "--width", "256", "--out", out]


def _steps(text: str) -> list[tuple[int, float, float]]:
    return [(int(a), float(b), float(c)) for a, b, c in STEP.findall(text)]


def reference(steps: int, work: str) -> list[float]:
    """The script's per-step losses without fastt, on one core (the workers' one thread)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTT")}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
    p = subprocess.run(_args(steps, os.path.join(work, "ref")), env=env, text=True,
                       capture_output=True, timeout=600,
                       preexec_fn=lambda: os.sched_setaffinity(0, {0}))
    if p.returncode:
        sys.exit(f"the reference run failed: {p.stderr[-2000:]}")
    return [loss for _, loss, _ in _steps(p.stdout)]


def _trigger(phase: str, rng: random.Random) -> tuple[str, int]:
    """The log line after which the kill comes, and how many steps after it."""
    if phase == "warmup":
        return "training step found", rng.randint(1, 6)
    if phase == "profile":
        return "profile phase from step", rng.randint(0, 1)
    if phase == "activation":
        return "measure phase from step", rng.randint(0, 1)
    return "activated strategy", rng.randint(5, 30)


def _due(at: int, after: int, steps: int) -> int:
    """The step to kill at: ``after`` steps past ``at``, within the run's last 5 steps."""
    return at + max(0, min(after, steps - at - 5))


def trial(phase: str, victim: int, rng: random.Random, steps: int, ref: list[float],
          work: str, cache: str) -> dict:
    """One run with one kill; what happened."""
    line, after = _trigger(phase, rng)
    run_dir = tempfile.mkdtemp(dir=work)
    out_path, err_path = os.path.join(run_dir, "out"), os.path.join(run_dir, "err")
    killed = resumed = None
    with LocalCluster(workers=3) as cluster:
        env = _env(cluster, cache if phase != "profile" else tempfile.mkdtemp(dir=work))
        with open(out_path, "w") as out, open(err_path, "w") as err:
            p = subprocess.Popen(_args(steps, os.path.join(run_dir, "ckpt")), env=env,
                                 stdout=out, stderr=err)
        began, at = time.monotonic(), None
        try:
            while p.poll() is None and time.monotonic() - began < DEADLINE_S:
                time.sleep(0.05)
                if killed is None:
                    n = len(_steps(open(out_path).read()))
                    if at is None and line in open(err_path).read():
                        at = n
                    if at is not None and n >= _due(at, after, steps):
                        sig = signal.SIGSTOP if phase == "stop" else signal.SIGKILL
                        os.kill(cluster.procs[victim].pid, sig)
                        killed = time.time()
                elif phase == "stop" and resumed is None and time.time() - killed > 20:
                    os.kill(cluster.procs[victim].pid, signal.SIGCONT)
                    resumed = time.time()
            hung = p.poll() is None
        finally:
            if p.poll() is None:
                p.kill()
            code = p.wait()
    text, err = open(out_path).read(), open(err_path).read()
    shutil.rmtree(run_dir, ignore_errors=True)
    got = _steps(text)
    row = {"phase": phase, "victim": victim,
           "killed_after_steps": _due(at, after, steps) if at is not None else None,
           "exit_code": code, "seconds": round(time.monotonic() - began, 1)}
    if killed is None:
        return {**row, "outcome": "not reached",
                "why": f"'{line}' not logged" if at is None else "the run ended first"}
    lost = re.search(r"fastt: (.* lost at step \d+ .*?) runs from the failed step on", err)
    if hung:
        return {**row, "outcome": "hung"}
    if code == 0 and [s for s, _, _ in got] == list(range(steps)):
        kill_step = next((s for s, _, t in got if t > killed), steps)
        diffs = [abs(a - b) / abs(b) for (_, a, _), b in zip(got, ref)]
        return {**row, "outcome": "recovered", "kill_step": kill_step,
                "to_next_step_s": round(next((t for _, _, t in got if t > killed), killed)
                                        - killed, 2),
                "max_rel_diff_before_kill": max(diffs[:kill_step], default=0.0),
                "max_rel_diff_after_kill": max(diffs[kill_step:], default=0.0),
                "said": lost.group(1) if lost else ""}
    said = re.findall(r"WorkerLostError: (.*)", err)
    return {**row, "outcome": "error" if said else "failed",
            "said": said[-1][:400] if said else err.strip().splitlines()[-1][:400]}


def overhead(steps: int, repeats: int, work: str, cache: str) -> dict:
    """Median step time on the kept plan with snapshots on and off, alternately."""
    ratios, on_s, off_s = [], [], []
    with LocalCluster(workers=3) as cluster:
        for _ in range(repeats):
            times = {}
            for elastic in ("on", "off"):
                p = subprocess.run(_args(steps, os.path.join(work, "ov")), text=True,
                                   env=_env(cluster, cache, FASTT_ELASTIC=elastic),
                                   capture_output=True, timeout=600)
                got = _steps(p.stdout)
                m = re.search(r"activated strategy \d+ .* at step (\d+)", p.stderr)
                start = int(m.group(1)) + 10 if m else steps // 2
                gaps = [b[2] - a[2] for a, b in zip(got, got[1:]) if a[0] >= start]
                times[elastic] = statistics.median(gaps)
            on_s.append(times["on"])
            off_s.append(times["off"])
            ratios.append(times["on"] / times["off"])
    return {"repeats": repeats, "steps": steps, "ratio_median": statistics.median(ratios),
            "ratios": ratios, "on_step_s": on_s, "off_step_s": off_s}


def comeback(steps: int, work: str) -> dict:
    """Worker 1 of 2 killed 20 steps into the first plan kept, and restarted at its address
    3 s after the loss is said: whether it is taken back, and the median step time before
    the kill, on the worker left, and over the last fifth of the run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTT")}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1", FASTT="1",
               FASTT_CACHE="0", FASTT_OVERHEAD="off")
    run_dir = tempfile.mkdtemp(dir=work)
    out_path, err_path = os.path.join(run_dir, "out"), os.path.join(run_dir, "err")
    killed = restarted = None
    with LocalCluster(workers=2) as cluster:
        env["FASTT_CLUSTER"] = cluster.spec
        with open(out_path, "w") as out, open(err_path, "w") as err:
            p = subprocess.Popen([sys.executable, CNN, "--steps", str(steps)], env=env,
                                 stdout=out, stderr=err)
        began, at = time.monotonic(), None
        try:
            while p.poll() is None and time.monotonic() - began < 3 * DEADLINE_S:
                time.sleep(0.05)
                text, n = open(err_path).read(), len(_steps(open(out_path).read()))
                if at is None and "activated strategy" in text:
                    at = n
                if killed is None and at is not None and n >= at + 20:
                    os.kill(cluster.procs[1].pid, signal.SIGKILL)
                    cluster.procs[1].wait()
                    killed = time.time()
                if killed and restarted is None and "lost at step" in text:
                    time.sleep(3.0)
                    cluster.restart(1)
                    restarted = time.time()
            hung = p.poll() is None
            ended = time.time()
        finally:
            if p.poll() is None:
                p.kill()
            code = p.wait()
    text, err = open(out_path).read(), open(err_path).read()
    if code:
        shutil.copy(err_path, os.path.join(work, "comeback-failed.err"))
    shutil.rmtree(run_dir, ignore_errors=True)
    got = _steps(text)
    row: dict = {"steps": steps, "exit_code": code, "hung": hung,
                 "all_steps": [s for s, _, _ in got] == list(range(steps))}
    if killed is None or restarted is None:
        return {**row, "outcome": "not reached"}
    times = [t for _, _, t in got]
    kill_i = next((i for i, t in enumerate(times) if t > killed), len(times))
    back_i = next((i for i, t in enumerate(times) if t > restarted), len(times))
    back = re.search(r"answers again; the next plan takes it in", err)
    after = err[back.end():] if back else ""
    kept = re.search(r"activated strategy \d+ \((.*?)\) at step (\d+) on 2 devices", after)

    def median_gap(a: int, b: int) -> float | None:
        gaps = [times[i + 1] - times[i] for i in range(max(a, 0), min(b, len(times) - 1))]
        return round(1e3 * statistics.median(gaps), 2) if gaps else None
    ok = code == 0 and row["all_steps"]
    return {**row, "outcome": "recovered" if ok else "failed",
            "said": "" if ok else err.strip().splitlines()[-1][:400] if err.strip() else "",
            "taken_back": bool(back), "plan_after": kept.group(1) if kept else None,
            "back_at_step": int(kept.group(2)) if kept else None,
            "restart_to_plan_s": round(times[int(kept.group(2))] - restarted, 1)
            if kept and int(kept.group(2)) < len(times) else None,
            "before_ms": median_gap(kill_i - 20, kill_i - 1),
            "alone_ms": median_gap(kill_i + 5, back_i),
            "end_ms": median_gap(len(times) * 4 // 5, len(times) - 1),
            "exit_s": round(ended - times[-1], 1) if times else None}


def markdown(doc: dict) -> str:
    lines = ["# Lost workers on a 3-worker local cluster", "",
             f"Measured on {doc['machine']}; {doc['steps']} steps of "
             "`benchmarks/scripts/elastic_mlp.py` per trial (see `benchmarks/faults.py`).", "",
             "| phase | trials | recovered | error | failed or hung | kill to next step (s, "
             "median) | loss difference before the kill (max) | after (max) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for phase in PHASES:
        rows = [r for r in doc["trials"] if r["phase"] == phase and
                r["outcome"] != "not reached"]
        if not rows:
            continue
        ok = [r for r in rows if r["outcome"] == "recovered"]
        bad = [r for r in rows if r["outcome"] in ("failed", "hung")]
        err = [r for r in rows if r["outcome"] == "error"]
        med = f"{statistics.median(r['to_next_step_s'] for r in ok):.1f}" if ok else "-"
        before = f"{max(r['max_rel_diff_before_kill'] for r in ok):.1e}" if ok else "-"
        after = f"{max(r['max_rel_diff_after_kill'] for r in ok):.1e}" if ok else "-"
        lines.append(f"| {phase} | {len(rows)} | {len(ok)} | {len(err)} | {len(bad)} | {med} | "
                     f"{before} | {after} |")
    skipped = [r for r in doc["trials"] if r["outcome"] == "not reached"]
    if skipped:
        lines += ["", f"{len(skipped)} trial(s) ended before the kill was due (not counted)."]
    for r in doc["trials"]:
        if r["outcome"] in ("error", "failed", "hung"):
            lines.append(f"- {r['phase']}, worker {r['victim']}: {r['outcome']}: "
                         f"{r.get('said', '')}")
    back = doc.get("comeback")
    if back:
        lines += ["", "## A worker that comes back", "",
                  f"`benchmarks/scripts/elastic_cnn.py`, {back[0]['steps']} steps on 2 workers: "
                  "worker 1 killed 20 steps into the first plan kept, restarted 3 s after the "
                  "loss is said (see `comeback` in `benchmarks/faults.py`). Step times are "
                  "medians (ms).", "",
                  "| trial | outcome | taken back | plan after it | restart to that plan (s) | "
                  "before the kill | on the worker left | last fifth of the run | "
                  "last step to exit (s) |",
                  "|---:|---|---|---|---:|---:|---:|---:|---:|"]
        for k, r in enumerate(back):
            lines.append(f"| {k + 1} | {r['outcome']} | {'yes' if r.get('taken_back') else 'no'}"
                         f" | {r.get('plan_after') or '-'} | {r.get('restart_to_plan_s', '-')} "
                         f"| {r.get('before_ms', '-')} | {r.get('alone_ms', '-')} | "
                         f"{r.get('end_ms', '-')} | {r.get('exit_s', '-')} |")
            if r.get("said"):
                lines.append(f"  - trial {k + 1}: {r['said']}")
    ov = doc.get("overhead")
    if ov:
        lines += ["", f"Snapshots' cost on the kept plan: step time with `FASTT_ELASTIC=on` over "
                      f"`off`, median of {ov['repeats']} alternating pairs: "
                      f"{ov['ratio_median']:.3f} (ratios "
                      f"{', '.join(f'{r:.3f}' for r in ov['ratios'])})."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 trials per phase, no overhead")
    ap.add_argument("--trials", type=int, default=10, help="trials per phase")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--phases", nargs="*", default=list(PHASES))
    ap.add_argument("--merge", action="store_true",
                    help="run --phases only, keeping the other results of the last run")
    ap.add_argument("--comebacks", type=int, default=3,
                    help="runs in which a killed worker is restarted (0: none)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    trials = 2 if args.quick else args.trials
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="fastt-faults-")
    cache = os.path.join(work, "cache")
    try:
        ref = reference(args.steps, work)
        with LocalCluster(workers=3) as cluster:  # the plan cache filled once
            subprocess.run(_args(args.steps, os.path.join(work, "seed")), text=True,
                           env=_env(cluster, cache), capture_output=True, timeout=900)
        rows = []
        for k in range(trials):
            for phase in args.phases:
                row = trial(phase, rng.randrange(3), rng, args.steps, ref, work, cache)
                print(f"{phase} {k}: {row['outcome']} (worker {row['victim']})", flush=True)
                rows.append(row)
        doc = {"machine": machine(), "steps": args.steps, "trials": rows,
               "date": time.strftime("%Y-%m-%d")}
        if args.merge:  # the results of the phases not run now, as they were
            with open(os.path.join(args.out, "faults.json"), encoding="utf-8") as f:
                old = json.load(f)
            doc["trials"] = [r for r in old["trials"] if r["phase"] not in args.phases] + rows
            doc["trials"].sort(key=lambda r: PHASES.index(r["phase"]))
            for key in ("overhead", "comeback"):
                if key in old:
                    doc[key] = old[key]
        elif not args.quick:
            doc["overhead"] = overhead(args.steps * 2, 3, work, cache)
        if args.comebacks:
            doc["comeback"] = []
            for k in range(args.comebacks):
                doc["comeback"].append(comeback(2500, work))
                print(f"comeback {k}: {doc['comeback'][-1]['outcome']}", flush=True)
        write_results(args.out, "faults", doc, markdown(doc))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
