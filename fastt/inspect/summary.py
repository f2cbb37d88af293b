"""``fastt inspect``: a terminal summary of strategy dumps.

Per session: the original graph's step time and every strategy with its status, predicted and
measured step times, speedup and why it was rolled back; then per strategy its devices (ops,
busy time predicted and measured) and its largest splits.
"""
from __future__ import annotations

from typing import Any, Sequence

from fastt import devices as devnames
from fastt.inspect.dumps import Dump
from fastt.inspect.trace import rows

MAX_TIMES = 6  # step times listed per strategy


def _ms(s: float | None) -> str:
    return "n/a" if s is None else f"{1e3 * s:.2f} ms"


def _times(values: Sequence[float]) -> str:
    shown = " ".join(f"{1e3 * v:.2f}" for v in values[:MAX_TIMES])
    return shown + (" ..." if len(values) > MAX_TIMES else "") if values else "-"


def _names(names: Sequence[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return (shown + f" (+{len(names) - limit})" if len(names) > limit else shown) or "-"


def _columns(header: Sequence[str], body: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(str(r[k])) for r in [header, *body]) for k in range(len(header))]
    return [indent + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
            for r in [header, *body]]


def sessions(dumps: Sequence[Dump]) -> dict[str, list[Dump]]:
    """Dumps grouped by session, sessions in order of their first dump."""
    out: dict[str, list[Dump]] = {}
    for d in dumps:
        out.setdefault(d.doc["session"], []).append(d)
    return out


def format_dumps(root: str, dumps: Sequence[Dump], top: int = 5,
                 declined: Sequence[dict[str, Any]] = ()) -> str:
    """The summary ``fastt inspect`` prints (``declined``: the records of sessions the
    plugin did not plan)."""
    groups = sessions(dumps)
    lines = [f"{root}: {len(dumps)} strateg{'y' if len(dumps) == 1 else 'ies'} in "
             f"{len(groups)} session{'' if len(groups) == 1 else 's'}"
             + (f"; {len(declined)} session{'' if len(declined) == 1 else 's'} not planned"
                if declined else "")]
    for doc in declined:
        lines += ["", f"session {doc['session']} (not planned, {doc['runs']} runs): "
                      f"{doc['reason']}"]
        lines += _columns(["runs", "updates trainables", "fetches", "targets", "feeds"],
                          [[str(s["runs"]), {True: "yes", False: "no"}.get(
                              s["updates_trainables"], "?"), _names(s["fetches"]),
                            _names(s["targets"]), _names(s["feeds"])]
                           for s in doc["signatures"]])
    for session, members in groups.items():
        lines += [""] + _session(session, members)
    for d in dumps:
        lines += [""] + _strategy(d, top)
    return "\n".join(lines)


def _session(session: str, members: Sequence[Dump]) -> list[str]:
    first = members[0].doc
    source = "session plugin" if first["source"] == "session" else "fastt plan/compare"
    head = f"session {session} ({source})"
    if first["original_step_time_s"] is not None:
        head += (f": original graph {_ms(first['original_step_time_s'])}/step "
                 f"({len(first['original_step_times_s'])} steps)")
    body = []
    for d in members:
        doc = d.doc
        speedup = doc["speedup"]
        body.append([str(doc["n"]), d.name, doc["strategy"], doc["status"].replace("_", " "),
                     _ms(doc["predicted_step_time_s"]), _ms(doc["measured_step_time_s"]),
                     "n/a" if speedup is None else f"{speedup:.2f}x",
                     _times(doc["measured_step_times_s"]), doc["reason"]])
    lines = [head] + _columns(["n", "dump", "strategy", "status", "predicted", "measured",
                               "speedup", "step times (ms)", "why"], body)
    running = [d for d in members if d.doc["status"] == "active"]
    if first["source"] == "session":
        lines.append("  now running: " + (
            f"strategy {running[-1].doc['n']} ({running[-1].doc['strategy']})"
            if running else "the original graph"))
    return lines


def _strategy(d: Dump, top: int) -> list[str]:
    doc = d.doc
    lines = [f"{d.name} ({doc['strategy']}, {doc['status'].replace('_', ' ')}): "
             f"{len(doc['devices'])} devices, {len(doc['placement'])} ops, "
             f"{len(doc['splits'])} splits, order by {doc['order_mechanism'] or 'n/a'}"]
    placed: dict[str, int] = {x: 0 for x in doc["devices"]}
    for dev in doc["placement"].values():
        placed[dev] = placed.get(dev, 0) + 1
    pred = {r.device: r for r in rows(d.load("predicted_trace.json") or {})}
    meas = {r.device: r for r in rows(d.load("measured_trace.json") or {})}
    body = [[devnames.short(x), str(n), _busy(pred.get(x)), _busy(meas.get(x))]
            for x, n in placed.items()]
    lines += _columns(["device", "ops", "predicted busy", "measured busy"], body)
    splits = sorted(doc["split_details"], key=lambda s: -(s["time_before_s"] or 0.0))[:top]
    if splits:
        lines.append(f"  top splits (of {len(doc['split_details'])}, by compute time before):")
        lines += _columns(["op", "dimension", "parts", "time before", "parameter bytes",
                           "step before -> after"],
                          [[s["op"], s["dim"], str(s["n"]), _ms(s["time_before_s"]),
                            str(s["param_bytes"]),
                            f"{_ms(s['step_before_s'])} -> {_ms(s['step_after_s'])}"]
                           for s in splits], indent="    ")
    else:
        lines.append("  splits: none")
    return lines


def _busy(row: Any) -> str:
    return "n/a" if row is None else _ms(row.busy_s)
