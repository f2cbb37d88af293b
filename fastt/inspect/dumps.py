"""Strategy dumps: ``strategy-<k>/`` directories, written and read.

A dump holds ``strategy.json`` (the strategy document, schema ``fastt.session-strategy``
version 3, ``schemas/strategy.schema.json``), ``cost_models.json``, ``predicted_trace.json``,
``measured_trace.json`` (strategies that ran), ``graph.dot`` (and ``graph.svg``) and
``report.html``. ``write`` writes a dump: the document every time, the files that do not change
(cost models, predicted trace, graph) once, the measured trace once it is known, the report
after them. Failures outside the document are logged, not raised (unless ``strict``): a dump
never stops training. (For a strategy that failed, at INFO: replaying it may fail the same way,
and its failure was logged already.)
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from fastt.inspect.schema import FILES, DumpError, check, validate
from fastt.jsonio import read_json, write_json

log = logging.getLogger("fastt")
SCHEMA = "fastt.session-strategy"
SCHEMA_VERSION = 3
_DIR = re.compile(r"^strategy-(\d+)$")


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
        "predicted_step_time_s": strategy.predicted_step_time_s if predicted_s is None
        else predicted_s,
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
            "dump": os.path.basename(dump), "predicted_step_time_s": predicted_s,
            "measured_step_times_s": list(measured_s), "measured_step_time_s":
            _median(measured_s), "activated_at_step": activated_at_step, "verdict": verdict}


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def new_dir(root: str) -> str:
    """A new ``root/strategy-<k>``, k after every number already there (never reused)."""
    os.makedirs(root, exist_ok=True)
    taken = [int(m.group(1)) for m in map(_DIR.match, os.listdir(root)) if m]
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
        from fastt.inspect import graphviz
        _guarded(f"graph.dot in {path}", lambda: graphviz.write(strategy, path), strict, level)
    if report:
        refresh(path, strict)


def refresh(path: str, strict: bool = False) -> None:
    """(Re)write ``path``'s ``report.html`` from its files and its session's other dumps."""
    from fastt.inspect import report
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


@dataclass
class Dump:
    """One dump directory, read: its document and its other files on demand."""
    path: str
    doc: dict[str, Any]

    @property
    def name(self) -> str:
        return os.path.basename(os.path.normpath(self.path))

    def file(self, name: str) -> str | None:
        p = os.path.join(self.path, name)
        return p if os.path.exists(p) else None

    def load(self, name: str) -> Any:
        """The JSON file ``name`` of the dump (None when it has none)."""
        p = self.file(name)
        if p is None:
            return None
        doc = read_json(p, "dump file", DumpError, expect=dict)
        if name in FILES:  # its shape, checked here: readers take it as documented
            check(doc, FILES[name], f"dump file {p!r}")
        return doc


def load(path: str) -> Dump:
    """The dump in directory ``path``; ``DumpError`` when it is not one."""
    file = os.path.join(path, "strategy.json")
    if not os.path.isfile(file):
        raise DumpError(f"{path!r} is not a strategy dump (it has no strategy.json)")
    doc = read_json(file, "strategy file", DumpError, expect=dict)
    if doc.get("schema") != SCHEMA:
        raise DumpError(f"{file!r} is not a fastt strategy dump (schema {doc.get('schema')!r})")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise DumpError(f"{file!r} has schema version {doc.get('schema_version')!r}; this "
                        f"fastt reads version {SCHEMA_VERSION}")
    errors = validate(doc, "strategy")
    if errors:
        raise DumpError(f"{file!r} does not follow the strategy schema: "
                        + "; ".join(errors[:5]))
    return Dump(path, doc)


DECLINED_SCHEMA = "fastt.session-declined"
_DECLINED = re.compile(r"^declined-(.+)\.json$")


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


def find_declined(root: str) -> list[dict[str, Any]]:
    """The declined-session records in ``root`` (unreadable ones skipped), oldest first."""
    try:
        names = [n for n in os.listdir(root) if _DECLINED.match(n)]
    except OSError:  # not a directory, or not readable: ``find`` says so
        return []

    def mtime(name: str) -> float:
        try:
            return os.path.getmtime(os.path.join(root, name))
        except OSError:  # gone meanwhile, or a dangling link: skipped below
            return 0.0
    out = []
    for name in sorted(names, key=mtime):
        try:
            doc = read_json(os.path.join(root, name), "declined-session record", DumpError)
        except DumpError:
            continue
        if isinstance(doc, dict) and not validate(doc, "declined"):
            out.append(doc)
    return out


def find(root: str) -> list[Dump]:
    """The dumps in ``root``: ``root`` itself when it is one, else its ``strategy-<k>``
    directories in order of k."""
    if not os.path.isdir(root):
        raise DumpError(f"{root!r} is not a directory")
    if os.path.exists(os.path.join(root, "strategy.json")):
        return [load(root)]
    try:
        names = _numbered(root)
    except OSError as e:
        raise DumpError(f"dump directory {root!r} cannot be read: {e.strerror or e}") from None
    if not names:
        raise DumpError(f"no strategy dumps in {root!r} (expected strategy-<k>/strategy.json, "
                        "written with FASTT_DUMP_DIR or 'fastt compare --dump')")
    return [load(os.path.join(root, name)) for _, name in names]


def siblings(dump: Dump) -> list[Dump]:
    """The dumps of ``dump``'s session in the same parent directory (itself included)."""
    parent = os.path.dirname(os.path.normpath(dump.path)) or "."
    out = []
    for _, name in _numbered(parent):
        try:
            d = dump if name == dump.name else load(os.path.join(parent, name))
        except DumpError:
            continue  # another fastt's, or broken: not this session's
        if d.doc["session"] == dump.doc["session"]:
            out.append(d)
    return out or [dump]


def _numbered(root: str) -> list[tuple[int, str]]:
    """``strategy-<k>`` directories of ``root`` with a strategy.json, by k."""
    return sorted((int(m.group(1)), m.group(0)) for m in map(_DIR.match, os.listdir(root))
                  if m and os.path.exists(os.path.join(root, m.group(0), "strategy.json")))


def session_history(dumps: Sequence[Dump]) -> list[dict[str, Any]]:
    """The most complete history among the dumps of one session: the longest, and among
    those the last written."""
    best = max(dumps, key=lambda d: (len(d.doc["history"]),
                                     os.path.getmtime(os.path.join(d.path, "strategy.json"))))
    return best.doc["history"]

