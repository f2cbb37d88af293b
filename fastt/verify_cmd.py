"""``fastt verify SCRIPT [ARGS...]``: run an unchanged training script under fastt with the
per-step equivalence check on, and say, per strategy activated, how far its first step is
from the original graph's (each fetched value and each variable after the step).

The script runs in a child process as ``python SCRIPT ARGS`` with ``FASTT=1``,
``FASTT_VERIFY=1`` and ``FASTT_VERIFY_REPORT`` (the file each check is appended to,
``fastt.plugin.verify.record``); its output goes through unchanged. A check is the same one
``FASTT_VERIFY=1`` runs in the plugin: a difference beyond reassociation rolls the strategy
back, and the script goes on on the original graph.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Mapping, Sequence

from fastt.errors import FasttError

# Settings a check needs whatever the script's length: every strategy tried, none from the
# plan cache, decisions on few steps (this run is about values, not timings). The caller's
# own FASTT_* settings win.
DEFAULTS = {"FASTT_DEVICES": "cpu:2", "FASTT_OVERHEAD": "off", "FASTT_CACHE": "0",
            "FASTT_WARMUP_STEPS": "2", "FASTT_MEASURE_STEPS": "3",
            "FASTT_MEASURE_SECONDS": "0"}

EXIT_WITHIN, EXIT_DIFFERS, EXIT_UNCHECKED = 0, 1, 3


def environment(base: Mapping[str, str], report: str, devices: str | None) -> dict[str, str]:
    """The child's environment: ``base`` with fastt and the check on, ``DEFAULTS`` where
    ``base`` sets nothing, ``devices`` (when given) over all."""
    env = dict(base)
    for k, v in DEFAULTS.items():
        if not env.get(k, "").strip():
            env[k] = v
    if devices:
        env["FASTT_DEVICES"] = devices
    env.update(FASTT="1", FASTT_VERIFY="1", FASTT_VERIFY_REPORT=report)
    return env


def _largest(check: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The tensor of ``check`` furthest from the original graph's, relative to its
    tolerance (one that differs without bound first)."""
    tensors = check.get("tensors") or []

    def key(t: Mapping[str, Any]) -> float:
        r, tol = t.get("relative"), t.get("tolerance") or 0.0
        if r is None:
            return float("inf")
        return r / tol if tol > 0 else (float("inf") if r > 0 else 0.0)
    return max(tensors, key=key) if tensors else None


def summary(checks: Sequence[Mapping[str, Any]], show_all: bool = False) -> str:
    """One line per check (and with ``show_all``, one per tensor)."""
    if not checks:
        return ("fastt verify: no strategy was activated, so nothing was checked (fastt's "
                "lines above say why)")
    lines = [f"fastt verify: {len(checks)} check{'s' * (len(checks) != 1)}"]
    for c in checks:
        name = c.get("strategy", "?") + (f" at step {c['step']}" if c.get("step") else "")
        if c.get("skipped"):
            lines.append(f"  {name}: not checked: {c['skipped']}")
            continue
        worst, n = _largest(c), len(c.get("tensors") or [])
        where = "" if worst is None else (
            f"; largest {_rel(worst.get('relative'))} at {worst['kind']} {worst['name']} "
            f"(tolerance {worst['tolerance']:g})")
        lines.append(f"  {name}: {n} tensors {'DIFFER' if c.get('verdict') else 'within'}"
                     f"{' reassociation' if not c.get('verdict') else ''}{where}")
        if c.get("verdict"):
            lines.append(f"    {c['verdict']}")
        if show_all:
            lines += [f"    {t['kind']:8s} {t['name']}: {_rel(t.get('relative'))} "
                      f"(tolerance {t['tolerance']:g})" for t in c.get("tensors") or []]
    return "\n".join(lines)


def _rel(r: float | None) -> str:
    return "unequal" if r is None else f"{r:.3g}"


def run(script: str, args: list[str], devices: str | None = None, json_out: str | None = None,
        show_all: bool = False) -> int:
    """Run ``script`` under the check; the summary printed; 0 when every check is within
    reassociation, 1 when one differs, 3 when nothing was checked, else the script's own
    failing exit code."""
    if not os.path.exists(script):
        raise FasttError(f"SCRIPT {script}: no such file")
    if not os.path.isfile(script):
        raise FasttError(f"SCRIPT {script}: is not a file")
    fd, report = tempfile.mkstemp(prefix="fastt-verify-", suffix=".jsonl")
    os.close(fd)
    try:
        code = subprocess.run([sys.executable, script, *args],
                              env=environment(os.environ, report, devices)).returncode
        from fastt.plugin.verify import read
        checks = read(report)
    finally:
        os.unlink(report)
    print(summary(checks, show_all), flush=True)
    if json_out:
        with open(json_out, "w", encoding="utf-8") as f:
            json.dump({"script": script, "args": args, "exit_code": code, "checks": checks},
                      f, indent=1)
    if code != 0:
        print(f"fastt verify: {script} exited with {code}", file=sys.stderr)
        return code if code > 0 else 128 - code  # a signal: as a shell says it
    if any(c.get("verdict") for c in checks):
        return EXIT_DIFFERS
    return EXIT_WITHIN if any(not c.get("skipped") for c in checks) else EXIT_UNCHECKED
