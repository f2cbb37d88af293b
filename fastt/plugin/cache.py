"""The plan cache: strategies kept at the end of a run, found again by the next run of the same
training step on the same devices (no TensorFlow here).

An entry is keyed by the digests of what makes a plan valid (``PARTS``): the training graph
(its ops, their inputs, devices and integer constants, such as a dataset's batch size), the
shapes of the step's feeds, the devices with their memory, the settings that shape a plan, and
the fastt and TensorFlow versions. The next run with the same parts starts on the entry's
strategy after a short check against the original graph (the plugin's usual measurement)
instead of profiling, planning and trials; a run whose parts differ from an entry of the same
script misses, and says which part changed.

Entries are JSON files (``<key>.json``) in ``FASTT_CACHE_DIR`` (default
``$XDG_CACHE_HOME/fastt`` or ``~/.cache/fastt``); a directory another user can write to is not
read. ``fastt cache list`` and ``fastt cache clear`` show and remove them.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from fastt.errors import FasttError
from fastt.jsonio import read_json, writing

log = logging.getLogger("fastt")

PARTS = ("graph", "feeds", "devices", "settings", "versions")
WHAT = {"graph": "its training graph", "feeds": "the shapes it feeds",
        "devices": "its devices", "settings": "fastt's settings that shape a plan",
        "versions": "the fastt or TensorFlow version"}
FORMAT = 1


class CacheError(FasttError):
    """The plan cache cannot be used (its directory is unsafe or unwritable)."""


def default_dir(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"),
                                                                 ".cache")
    return os.path.join(base, "fastt")


def digest(value: Any) -> str:
    """A short digest of a JSON-able value (or of bytes)."""
    data = value if isinstance(value, bytes) else json.dumps(value, sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def key_of(parts: Mapping[str, str]) -> str:
    return digest([parts[p] for p in PARTS])


@dataclass
class Hit:
    """An entry found for a run: its document (``strategy``, ``costs``, ...)."""
    key: str
    doc: dict[str, Any]


class PlanCache:
    """The entries in directory ``root``."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _safe(self) -> bool:
        """Whether ``root`` may be read: a directory of this user's that no one else can
        write to (an entry is a plan fastt runs)."""
        try:
            st = os.stat(self.root)
        except FileNotFoundError:
            return False
        if not stat.S_ISDIR(st.st_mode):
            raise CacheError(f"the plan cache {self.root!r} is not a directory "
                             "(FASTT_CACHE_DIR)")
        if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o022):
            raise CacheError(f"the plan cache {self.root!r} is writable by other users or "
                             "not owned by this one (FASTT_CACHE_DIR); fastt reads no plan from it")
        return True

    def entries(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(key, document) of every readable entry."""
        if not self._safe():
            return
        for name in sorted(os.listdir(self.root)):
            if not name.endswith(".json"):
                continue
            try:
                doc = read_json(os.path.join(self.root, name), "plan cache entry",
                                CacheError, expect=dict)
            except CacheError as e:
                log.debug("fastt: %s; skipped", e)
                continue
            if doc.get("format") == FORMAT:
                yield name[:-5], doc

    def lookup(self, parts: Mapping[str, str], script: str) -> tuple[Hit | None, str]:
        """The entry for ``parts``, or None and why it missed (an entry of the same
        ``script`` whose parts differ names them; "" when there was none)."""
        key = key_of(parts)
        path = os.path.join(self.root, key + ".json")
        if self._safe() and os.path.exists(path):
            try:
                doc = read_json(path, "plan cache entry", CacheError, expect=dict)
            except CacheError as e:
                return None, str(e)
            if doc.get("format") == FORMAT and doc.get("parts") == dict(parts):
                return Hit(key, doc), ""
        same = [doc for _, doc in self.entries() if doc.get("script") == script]
        if not same:
            return None, ""
        newest = max(same, key=lambda d: d.get("stored", 0.0))
        changed = [WHAT[p] for p in PARTS if newest.get("parts", {}).get(p) != parts[p]]
        return None, "changed since the plan cached for this script: " + ", ".join(changed)

    def store(self, parts: Mapping[str, str], script: str, doc: dict[str, Any]) -> str:
        """Write the entry for ``parts``; its path."""
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        self._safe()
        key = key_of(parts)
        path = os.path.join(self.root, key + ".json")
        full = {"format": FORMAT, "key": key, "parts": dict(parts), "script": script,
                "stored": time.time(), **doc}
        with writing(path, "plan cache entry", CacheError):
            fd, tmp = tempfile.mkstemp(dir=self.root, suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(full, f)
                os.replace(tmp, path)  # a reader sees the whole entry or none
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
        return path

    def remove(self, key: str) -> None:
        try:
            os.remove(os.path.join(self.root, key + ".json"))
        except FileNotFoundError:
            pass

    def clear(self) -> int:
        """Remove every entry; how many there were."""
        keys = [k for k, _ in self.entries()]
        for k in keys:
            self.remove(k)
        return len(keys)
