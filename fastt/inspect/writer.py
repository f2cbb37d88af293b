"""Strategy dumps written (``fastt.inspect.dumps`` reads them).

``write`` writes a dump: the document every time, the files that do not change (cost models,
predicted trace, graph) once, the measured trace once it is known, the report after them.
Failures outside the document are logged, not raised (unless ``strict``): a dump never stops
training. (For a strategy that failed, at INFO: replaying it may fail the same way, and its
failure was logged already.)
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import statistics
from typing import Any, Callable, Sequence

from fastt.inspect import graphviz, report
from fastt.inspect.dumps import DECLINED_SCHEMA, SCHEMA, SCHEMA_VERSION, STRATEGY_DIR
from fastt.inspect.schema import DumpError, validate
from fastt.jsonio import write_json

log = logging.getLogger("fastt")


def document(strategy: Any, *, source: str, session: str, n: int, status: str,
             history: list[dict[str, Any]], reason: str = "",
             measured_s: Sequence[float] = (), original_s: Sequence[float] = (),
             activated_at_step: int | None = None, order_mechanism: str | None = None,
             predicted_s: float | None = None, decision: dict[str, Any] | None = None
             ) -> dict[str, Any]:
    """The ``strategy.json`` document of ``strategy`` (a ``Strategy``)."""
    doc = strategy.to_dict()
    mine, orig = _median(measured_s), _median(original_s)
    doc.update({
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "source": source,
        "session": session, "n": n, "dump": "", "status": status, "reason": reason,
        "predicted_step_time_s": _known(strategy.predicted_step_time_s if predicted_s is None
                                        else predicted_s),
        "simulated_step_time_s": _known(strategy.simulated_step_time_s),
        "measured_step_times_s": list(measured_s), "measured_step_time_s": mine,
        "original_step_times_s": list(original_s), "original_step_time_s": orig,
        "speedup": (orig / mine) if orig and mine else None,
        "activated_at_step": activated_at_step, "order_mechanism": order_mechanism,
        "decision": decision, "history": history,
    })
    return doc


def history_entry(n: int, name: str, status: str, predicted_s: float, reason: str = "",
                  dump: str = "", measured_s: Sequence[float] = (),
                  activated_at_step: int | None = None, verdict: str | None = None
                  ) -> dict[str, Any]:
    return {"n": n, "strategy": name, "status": status, "reason": reason,
            "dump": os.path.basename(dump), "predicted_step_time_s": _known(predicted_s),
            "measured_step_times_s": list(measured_s), "measured_step_time_s":
            _median(measured_s), "activated_at_step": activated_at_step, "verdict": verdict}


def _known(seconds: float) -> float | None:
    """A predicted time as the dump holds it: null where none was predicted (a step fitted
    into memory runs before any profile)."""
    return None if math.isnan(seconds) else seconds


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def new_dir(root: str) -> str:
    """A new ``root/strategy-<k>``, k after every number already there (never reused)."""
    os.makedirs(root, exist_ok=True)
    taken = [int(m.group(1)) for m in map(STRATEGY_DIR.match, os.listdir(root)) if m]
    k = max(taken, default=0) + 1
    while True:
        path = os.path.join(root, f"strategy-{k}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:  # another process took it
            k += 1


def write(path: str, doc: dict[str, Any], *, strategy: Any = None, models: Any = None,
          predicted: Callable[[], dict[str, Any]] | None = None,
          measured: Callable[[], dict[str, Any]] | None = None, report: bool = True,
          strict: bool = False) -> None:
    """Write the dump ``doc`` describes in ``path``: see the module's docstring."""
    doc["dump"] = os.path.basename(path)
    for h in doc["history"]:
        if h["n"] == doc["n"] and not h["dump"]:
            h["dump"] = doc["dump"]
    level = logging.INFO if doc["status"] == "failed" else logging.WARNING
    errors = validate(doc, "strategy")
    if errors:
        _failed(f"strategy.json in {path}", DumpError("; ".join(errors[:5])), strict)
    write_json(os.path.join(path, "strategy.json"), doc)

    def once(name: str, make: Callable[[], Any]) -> None:
        target = os.path.join(path, name)
        if not os.path.exists(target):
            _guarded(f"{name} in {path}", lambda: write_json(target, make()), strict, level)
    if models is not None:
        once("cost_models.json", models.to_dict)
    if predicted is not None:
        once("predicted_trace.json", predicted)
    if measured is not None:
        once("measured_trace.json", measured)
    if strategy is not None and not os.path.exists(os.path.join(path, "graph.dot")):
        _guarded(f"graph.dot in {path}", lambda: graphviz.write(strategy, path), strict, level)
    if report:
        refresh(path, strict)


def refresh(path: str, strict: bool = False) -> None:
    """(Re)write ``path``'s ``report.html`` from its files and its session's other dumps."""
    _guarded(f"report.html in {path}", lambda: report.write(path), strict)


def _guarded(what: str, fn: Callable[[], Any], strict: bool,
             level: int = logging.WARNING) -> None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - a dump never stops training
        _failed(what, e, strict, level)


def _failed(what: str, error: Exception, strict: bool, level: int = logging.WARNING) -> None:
    if strict:
        raise error
    log.log(level, "fastt: could not write %s (%s: %s)", what, type(error).__name__, error)


def declined_document(session: str, reason: str, runs: int,
                      signatures: list[dict[str, Any]]) -> dict[str, Any]:
    """The record of a session the plugin did not plan (``schemas/declined.schema.json``)."""
    return {"schema": DECLINED_SCHEMA, "schema_version": 1, "session": session,
            "reason": reason, "runs": runs, "signatures": signatures[:10]}


def write_declined(root: str, doc: dict[str, Any], strict: bool = False) -> str:
    """Write ``root/declined-<session>.json``; its path ("" when it could not be written)."""
    path = os.path.join(root, f"declined-{doc['session']}.json")
    try:
        errors = validate(doc, "declined")
        if errors:
            raise DumpError("; ".join(errors[:5]))
        os.makedirs(root, exist_ok=True)
        write_json(path, doc)
        return path
    except Exception as e:  # noqa: BLE001 - a record never stops training
        _failed(path, e, strict)
        return ""


def remove_declined(root: str, session: str) -> None:
    """Remove the record of ``session`` (it was planned after all)."""
    path = os.path.join(root, f"declined-{session}.json") if root else ""
    with contextlib.suppress(OSError):  # a record never stops training
        if path and os.path.exists(path):
            os.remove(path)
