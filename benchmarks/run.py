"""Regenerate the benchmark report: the simulated testbed, the real testbed, the distance to
the optimum on small graphs, pipelines, transfer priorities, REPORT.md.

    python benchmarks/run.py [--quick]

``--quick`` is a smoke run (a few small models, few steps: minutes); the full run takes about
an hour on 2 cores. Results and the report go to benchmarks/results/.
"""
from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    quick = ["--quick"] if "--quick" in sys.argv[1:] else []
    extra = [a for a in sys.argv[1:] if a != "--quick"]
    if extra:
        sys.exit(f"unknown arguments {extra}; usage: python benchmarks/run.py [--quick]")
    runs = [["simulated.py"], ["real.py"], ["optimality.py"], ["pipeline.py"],
            ["transfer_priorities.py"],
            ["transfer_priorities.py", "--simulated"], ["report.py"]]
    for script, *rest in runs:
        args = [sys.executable, os.path.join(HERE, script)] + rest + (
            quick if script != "report.py" else [])
        print("+", " ".join(args), flush=True)
        code = subprocess.call(args)
        if code:
            print(f"{script} failed with exit code {code}", file=sys.stderr)
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
