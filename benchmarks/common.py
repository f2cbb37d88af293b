"""What the side-by-side benchmarks share: the command line and a timed block of steps."""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from typing import Any, Callable


def arguments(doc: str, steps: int, repeats: int) -> argparse.Namespace:
    """``--quick``, ``--steps``, ``--repeats`` and ``--out`` (default benchmarks/results)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="two models, few steps")
    ap.add_argument("--steps", type=int, default=steps, help="steps per timed block")
    ap.add_argument("--repeats", type=int, default=repeats, help="blocks per variant")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    return ap.parse_args()


def real_arguments(doc: str, *extra: tuple[str, str], repeats: int = 5) -> argparse.Namespace:
    """The real testbed's command line: ``--quick``, ``--models``, ``--steps`` (10),
    ``--repeats`` (``repeats``) and ``--out``; ``extra``: (flag, help) switches of the
    script."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="two models, few steps")
    for flag, text in extra:
        ap.add_argument(flag, action="store_true", help=text)
    ap.add_argument("--models", nargs="*", help="model names (default: all)")
    ap.add_argument("--steps", type=int, default=10, help="steps per timed block")
    ap.add_argument("--repeats", type=int, default=repeats, help="blocks per variant (>= 3)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    return ap.parse_args()


def training_session(m: Any, graph_def: Any, target: str = "", config: Any = None
                     ) -> tuple[Any, list[Any], dict[Any, Any]]:
    """A session on ``target`` over ``graph_def`` (a zoo model ``m``'s graph, rewritten or
    not), its variables initialized, and the fetches and feeds of one training step."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        tf1.import_graph_def(graph_def, name="")
    sess = tf1.Session(target, graph=g, config=config)
    sess.run(g.get_operation_by_name(m.init.name))
    fetches = [g.get_operation_by_name(m.train_op.name), g.get_tensor_by_name(m.loss.name)]
    feed = {g.get_tensor_by_name(k + ":0"): v for k, v in m.feeds.items()}
    return sess, fetches, feed


def block(fn: Callable[[], object], steps: int) -> float:
    """Mean seconds per call of ``fn`` over ``steps`` calls in a row."""
    t = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t) / steps


def step_times(fn: Callable[[], object], steps: int) -> list[float]:
    """Seconds of each of ``steps`` calls of ``fn`` in a row."""
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def keeps_candidate(kept: Callable[[], object], candidate: Callable[[], object], steps: int,
                    looks: int = 3, tie_keeps: bool = False) -> dict[str, Any]:
    """The session plugin's decision between the graph it runs (``kept``) and a candidate:
    per-step times of each (in alternating halves, so that a drift of the machine hits both),
    compared with its rule (``fastt.plugin.measure.compare``), ``steps`` more on each side
    while undecided, at most ``looks`` times. The verdict as a dict; "keep" is whether the
    candidate replaces the kept graph (only when significantly faster; with ``tie_keeps``,
    also when undecided: the kept plan's own order against TensorFlow's); "kept_s" and
    "candidate_s" the median step of each."""
    from fastt.plugin.measure import CONFIDENCE, compare

    a: list[float] = []
    b: list[float] = []
    for look in range(looks):
        for _ in range(2):
            a += step_times(kept, max(steps // 2, 2))
            b += step_times(candidate, max(steps // 2, 2))
        v = compare(a, b, seed=look, confidence=1 - (1 - CONFIDENCE) / looks)
        if v.verdict != "undecided":
            break
    keep = v.verdict == "faster" or (tie_keeps and v.verdict == "undecided")
    return {**v.as_dict(), "keep": keep, "steps": len(a), "kept_s": statistics.median(a),
            "candidate_s": statistics.median(b)}


def cpu_model() -> str:
    """The processor's name as the kernel reports it (``/proc/cpuinfo``), else Python's guess:
    measured times are only comparable on one model (AlexNet's step on one core took 0.55 s
    on one x86_64 host of this project and 2.3 s on another)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """What timings were measured on: processor, cores, Python."""
    return (f"{cpu_model()} ({platform.machine()}), {os.cpu_count()} cores, Python "
            f"{platform.python_version()}")


def previous_full_run(path: str, cpu: str | None = None) -> dict | None:
    """The results of an earlier full (not ``--quick``) run at ``path``, to update model by
    model; None when there is none. ``cpu``: a run of measured times, which stops
    (``measured_on``) when that run was measured on another processor."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    meta = doc.get("meta", {})
    if meta.get("quick"):
        return None
    if cpu is not None:
        measured_on(meta, cpu, path)
    return doc


def timed_on(meta: dict, cpu: str, what: str) -> bool:
    """Whether the run of ``meta`` (``what``: where it is kept) was timed on processor ``cpu``;
    says so when not (a run of timings that are quick to take again then starts anew)."""
    if meta.get("cpu") == cpu:
        return True
    print(f"{what}: measured on {_processor(meta)}, not on this {cpu}: a new run starts "
          "instead of updating its rows", flush=True)
    return False


def measured_on(meta: dict, cpu: str, what: str) -> None:
    """Stop unless the run of ``meta`` (``what``: where it is kept) was measured on processor
    ``cpu``: rows of two machines would share one table, and starting a new file over it would
    lose every other model's rows."""
    if meta.get("cpu") != cpu:  # hours of measurements: never dropped on the way
        raise SystemExit(
            f"{what} holds a full run measured on {_processor(meta)}, not on this {cpu}: "
            "measuring some models here would mix two machines in one table. Run every model "
            "for a new full run, or pass --out DIR to keep these apart.")


def _processor(meta: dict) -> str:
    """The processor a run of ``meta`` was measured on, as said to the user."""
    return meta.get("cpu") or "an unrecorded processor"


def with_row(rows: list[dict], row: dict, order: list[str]) -> list[dict]:
    """``rows`` with ``row`` in place of the row of the same model, in the zoo's order."""
    rows = [r for r in rows if r["model"] != row["model"]] + [row]
    return sorted(rows, key=lambda r: order.index(r["model"]) if r["model"] in order
                  else len(order))


def write_json(path: str, doc: dict) -> None:
    """Write ``doc`` to ``path`` atomically (a reader never sees half a file)."""
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".tmp", path)


def write_results(out: str, name: str, doc: dict, text: str) -> None:
    """``doc`` as ``out/name.json`` and ``text`` (its Markdown) as ``out/name.md``, printed."""
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, f"{name}.json"), doc)
    with open(os.path.join(out, f"{name}.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
