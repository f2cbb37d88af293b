"""What the session plugin says about its decisions: the reasons recorded in dumps and the
lines it logs (no TensorFlow here)."""
from __future__ import annotations

import re

from fastt.plugin.budget import Budget
from fastt.plugin.entry import Entry
from fastt.plugin.measure import Verdict
from fastt.sched.search.memory_fit import FITTED


def label(entry: Entry | None) -> str:
    """How a strategy is named in lines and dumps (None: the original graph)."""
    if entry is None:
        return "the original graph"
    fifo = not entry.ordered and entry.name != FITTED  # a fitted step has no planned order
    return (f"strategy {entry.n} ({entry.name}{', FIFO order' if fifo else ''}"
            f"{', from the plan cache' if entry.cached else ''})")


def judged(v: Verdict) -> str:
    return (f"{v.verdict}, ratio {v.ratio:.3f} ({100 * v.confidence:.1f}% CI "
            f"{v.low:.3f}-{v.high:.3f})")


def why_not(entry: Entry, previous: Entry | None, v: Verdict) -> str:
    """Why ``entry`` was not kept over ``previous``, from verdict ``v``."""
    base = label(previous)
    ci = f"ratio {v.ratio:.3f}, {100 * v.confidence:.1f}% CI {v.low:.3f}-{v.high:.3f}"
    mine = 1e3 * (entry.measured_median_s or 0.0)
    if v.verdict == "slower":
        return f"measured {mine:.2f} ms/step, slower than {base} ({ci})"
    if v.verdict == "load changed":
        return f"{v.reason} while it was measured; not compared with {base} ({ci})"
    return (f"measured {mine:.2f} ms/step, not significantly faster than {base} after "
            f"{len(entry.measured_s)} settled steps ({ci})")


def unfinished(entry: Entry, steps: int, running: Entry | None) -> str:
    """Why ``entry`` has no decision: the session closed ``steps`` steps into measuring it
    (compared with ``running``) or, once found faster, into measuring its baseline again."""
    ran = f"{steps} step{'' if steps == 1 else 's'}"
    if entry.verdict is None:
        return (f"the session closed {ran} into its measurement, before it could be compared "
                f"with {label(running)}")
    return (f"measured {judged(entry.verdict)} against {entry.baseline}, but the session "
            f"closed {ran} into measuring {entry.baseline} again after it, so it was never "
            "confirmed")


def left_unfinished(entry: Entry) -> str:
    """The line logged when the session closes before ``entry`` was decided."""
    return (f"fastt: left {label(entry)} unfinished: {entry.reason}"
            + (f"; dump {entry.dump}" if entry.dump else ""))


def speedup(original_s: float | None, e: Entry) -> float:
    mine = e.measured_median_s
    return original_s / mine if original_s and mine else float("nan")


def decided(e: Entry, original_s: float | None) -> str:
    """The line logged when ``e`` is kept or rolled back."""
    v = e.verdict
    verb = "activated" if e.status == "active" else "rolled back"
    compared = "" if v is None else f"; against {e.baseline}: {judged(v)}"
    if e.recheck is not None:
        compared += f", measured again after it: {judged(e.recheck)}"
    # a rolled-back verdict says why; a trial stopped before one has only its reason
    reason = f" ({e.reason})" if e.reason and (e.status != "rolled_back" or v is None) else ""
    at = f" at step {e.decided_at}" if e.decided_at is not None else ""
    mine = e.measured_median_s
    measured = (f"measured {1e3 * mine:.2f} ms/step, original {1e3 * (original_s or 0.0):.2f}"
                f" ms/step, speedup {speedup(original_s, e):.2f}x") if mine else \
        f"not measured, original {1e3 * (original_s or 0.0):.2f} ms/step"
    return (f"fastt: {verb} {label(e)}{at} on {len(getattr(e.strategy, 'devices', []))} devices: "
            f"predicted {1e3 * e.predicted_s:.2f} ms/step, {measured}"
            f"{compared}{reason}" + (f"; dump {e.dump}" if e.dump else ""))


def closed(steps: int, on: Entry | None, original_s: float | None, tried: int,
           dump_dir: str, dumped: bool = True, passed: int = 0) -> str:
    """The line a session logs when it closes on ``on`` after trying ``tried`` strategies
    (``dumped``: a dump of them was written) and passing over ``passed`` plans predicted no
    faster than the graph running."""
    where = label(on)
    if on is not None and on.measured_s:
        where += f", {speedup(original_s, on):.2f}x over the original"
    if not dump_dir:
        dumps = "dumps off (set FASTT_DUMP_DIR)"
    elif dumped or not tried:
        dumps = f"dumps in {dump_dir}"
    else:
        dumps = f"no dump could be written in FASTT_DUMP_DIR={dump_dir}"
    return (f"fastt: session closed after {steps} training steps on {where}; {tried} "
            f"strateg{'y' if tried == 1 else 'ies'} tried"
            + (f", {passed} planned but predicted no faster" if passed else "") + f", {dumps}")


def closed_in_warmup(steps: int, times: list[float], measure_steps: int,
                     measure_seconds: float) -> str:
    """The line a session logs when it closes before the original graph was measured."""
    return (f"fastt: session closed after {steps} training steps, before the original graph's "
            f"step time was measured ({len(times)} steps over {sum(times):.2f} s so far; a "
            f"measurement takes {measure_steps} steady steps over at least "
            f"{measure_seconds:.1f} s: FASTT_MEASURE_STEPS, FASTT_MEASURE_SECONDS); nothing "
            "was tried")


def failure(error: BaseException) -> str:
    """One line saying what failed: the error's type, the op it names and that op's type
    (TensorFlow's errors carry its NodeDef) and the line of its message that says why, not
    TensorFlow's headers and stack traces."""
    name = type(error).__name__
    node_def = getattr(error, "node_def", None)
    node = getattr(node_def, "name", "") or ""
    kind = getattr(node_def, "op", "") or ""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    after_node = [i for i, ln in enumerate(lines) if ln.startswith("Node:")]
    noise = ("Graph execution error", "Detected at node", "File ", "Node:", "[[",
             "Original stack trace", "Instructions for updating")
    pool = lines[after_node[0] + 1:] if after_node else lines
    # "2 root error(s) found." heads the errors of several devices, each "(k) CODE: why"
    pool = [re.sub(r"^\(\d+\) [A-Z_]+: ", "", ln) for ln in pool
            if not re.match(r"\d+ root error\(s\) found", ln)]
    why = next((ln for ln in pool if not ln.startswith(noise)), "")
    at = f" at op {node!r}" + (f" ({kind})" if kind else "") if node else ""
    if not why:
        return f"{name}{at}" if node else f"{name} while fastt was working"
    return f"{name}{at}: {why}"


def cost(b: Budget) -> str:
    """What fastt's own work cost the session, as the closing line says it."""
    session = b.elapsed()
    share = f", {100 * b.spent / session:.1f}% of the session's {session:.1f} s" \
        if session > 0 else ""
    limit = f"budget {b.describe()}: FASTT_OVERHEAD" if b.on else "no budget: FASTT_OVERHEAD=off"
    return f"fastt's own cost {b.spent:.2f} s{share} ({limit})"
