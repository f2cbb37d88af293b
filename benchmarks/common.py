"""What the side-by-side benchmarks share: the command line and a timed block of steps."""
from __future__ import annotations

import argparse
import os
import time
from typing import Callable


def arguments(doc: str, steps: int, repeats: int) -> argparse.Namespace:
    """``--quick``, ``--steps``, ``--repeats`` and ``--out`` (default benchmarks/results)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="two models, few steps")
    ap.add_argument("--steps", type=int, default=steps, help="steps per timed block")
    ap.add_argument("--repeats", type=int, default=repeats, help="blocks per variant")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    return ap.parse_args()


def block(fn: Callable[[], object], steps: int) -> float:
    """Mean seconds per call of ``fn`` over ``steps`` calls in a row."""
    t = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t) / steps
