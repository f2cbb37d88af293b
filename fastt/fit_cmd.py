"""``fastt plan --fit``: per strategy, the largest global batch whose plan fits the devices'
memory, and its step time; where none fits, by how much the smallest batch tried is over.

The batch is searched in multiples of the devices (each device an equal share of the batch):
doubling from the batch given until a plan no longer fits, then halving the gap. Each batch
tried is a graph built at that batch (a zoo model) and planned as ``fastt plan`` plans it; the
strategies share each batch's graph and what their plans share (``Planning``). A strategy that
declines the graph for another reason than memory (one device given to data parallelism) says
so and is not searched.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from fastt.errors import DoesNotFit, FasttError, NoBatch
from fastt.plan_cmd import Setup, plan_one
from fastt.sched.strategy import Strategy

MAX_DOUBLINGS = 16  # the search stops at 2**16 times the batch given


@dataclass
class Fit:
    """Strategy ``name``'s largest batch that fits and its plan (None: none fits, or the
    strategy declined; ``why`` says so), and why the batch above it did not fit."""
    name: str
    batch: int | None = None
    plan: Strategy | None = None
    why: str = ""


def largest_batches(setup_at: Callable[[int], Setup], names: Sequence[str], batch: int,
                    devices: int) -> list[Fit]:
    """For each strategy of ``names``, its largest batch (a multiple of ``devices``) whose
    plan fits, searched from ``batch``; ``setup_at(b)``: what ``fastt plan`` plans at batch
    b. O(log(largest / batch)) batches built, each planned once per strategy."""
    setups: dict[int, Setup] = {}
    plans: dict[tuple[int, str], Strategy | FasttError] = {}

    def tried(b: int, name: str) -> Strategy | FasttError:
        if (b, name) not in plans:
            if b not in setups:
                setups.clear()  # one graph held at a time: a large batch's is large
                setups[b] = setup_at(b)
            try:
                plans[(b, name)] = plan_one(setups[b], name)
            except FasttError as e:
                plans[(b, name)] = e
        return plans[(b, name)]

    def fits(b: int, name: str) -> bool:
        got = tried(b, name)
        if isinstance(got, (DoesNotFit, NoBatch)) or isinstance(got, Strategy):
            return isinstance(got, Strategy)
        raise got  # declined for another reason

    step = max(1, devices)
    b0 = max(step, step * round(batch / step))
    out = []
    for name in names:
        try:
            out.append(_search(name, b0, step, fits, tried))
        except FasttError as e:
            out.append(Fit(name, why=str(e)))
    return out


def _search(name: str, b0: int, step: int, fits: Callable[[int, str], bool],
            tried: Callable[[int, str], Strategy | FasttError]) -> Fit:
    """The largest multiple of ``step`` that fits for ``name`` (``Fit``)."""
    if not fits(b0, name):
        hi = b0
        while True:  # halve until one fits
            lo = max(step, step * (hi // step // 2))
            if fits(lo, name):
                break
            if lo == step:
                return Fit(name, why=f"at a batch of {lo}: {tried(lo, name)}")
            hi = lo
    else:
        lo, hi = b0, 2 * b0
        for _ in range(MAX_DOUBLINGS):
            if not fits(hi, name):
                break
            lo, hi = hi, 2 * hi
        else:
            return _fit(name, lo, tried, "")
    while hi - lo > step:  # lo fits, hi does not
        mid = step * ((lo + hi) // 2 // step)
        if fits(mid, name):
            lo = mid
        else:
            hi = mid
    return _fit(name, lo, tried, f"at {hi}: {tried(hi, name)}")


def _fit(name: str, b: int, tried: Callable[[int, str], Strategy | FasttError],
         why: str) -> Fit:
    plan = tried(b, name)
    assert isinstance(plan, Strategy)
    return Fit(name, b, plan, why)


def table(fits: Sequence[Fit]) -> str:
    """One row per strategy: its largest batch, step time and throughput; then why each
    stopped where it did."""
    lines = [f"{'strategy':<18}{'largest batch':>14}{'step time':>14}{'samples/s':>12}"
             f"{'recomputed':>12}{'micro-batches':>15}"]
    for f in fits:
        if f.plan is None or f.batch is None:
            lines.append(f"{f.name:<18}{'none':>14}")
            continue
        s = f.plan.predicted_step_time_s
        lines.append(f"{f.name:<18}{f.batch:>14}{1e3 * s:>11.2f} ms{f.batch / s:>12.1f}"
                     f"{f.plan.recomputed:>12}{f.plan.micro_batches:>15}")
    lines.append("")
    for f in fits:
        if f.plan is None:
            lines.append(f"{f.name}: " + (f"fits no batch ({f.why})" if f.why.startswith("at")
                                          else f"not searched: {f.why}"))
        elif f.why:
            lines.append(f"{f.name}: the next batch tried does not fit ({f.why})")
    return "\n".join(lines)
