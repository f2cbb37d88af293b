"""Strategy dumps: ``strategy-<k>/`` directories, read (``fastt.inspect.writer`` writes them).

A dump holds ``strategy.json`` (the strategy document, schema ``fastt.session-strategy``
version 3, ``fastt/schemas/strategy.schema.json``), ``cost_models.json``, ``predicted_trace.json``,
``measured_trace.json`` (strategies that ran), ``graph.dot`` (and ``graph.svg``) and
``report.html``. Next to them, ``declined-<session>.json`` records a session the plugin did
not plan.
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Sequence

from fastt.inspect.schema import FILES, DumpError, check, validate
from fastt.jsonio import read_json

log = logging.getLogger("fastt")
SCHEMA = "fastt.session-strategy"
SCHEMA_VERSION = 3
STRATEGY_DIR = re.compile(r"^strategy-(\d+)$")


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
    return sorted((int(m.group(1)), m.group(0)) for m in map(STRATEGY_DIR.match, os.listdir(root))
                  if m and os.path.exists(os.path.join(root, m.group(0), "strategy.json")))


def session_history(dumps: Sequence[Dump]) -> list[dict[str, Any]]:
    """The most complete history among the dumps of one session: the longest, and among
    those the last written."""
    best = max(dumps, key=lambda d: (len(d.doc["history"]),
                                     os.path.getmtime(os.path.join(d.path, "strategy.json"))))
    return best.doc["history"]

