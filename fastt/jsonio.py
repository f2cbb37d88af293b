"""Reading JSON documents with errors that name the file and what it should have been."""
from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from fastt.errors import FasttError


def read_json(path: str | os.PathLike[str], what: str,
              error: type[FasttError] = FasttError) -> Any:
    """The parsed JSON at ``path``; ``error`` naming ``what`` the file is when it is missing
    or not JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise error(f"{what} {os.fspath(path)!r} does not exist") from None
    except json.JSONDecodeError as e:
        raise error(f"{what} {os.fspath(path)!r} is not JSON: {e}") from None


def write_json(path: str | os.PathLike[str], doc: Any, indent: int | None = 1) -> None:
    """Write ``doc`` to ``path`` atomically (a reader never sees half a file)."""
    tmp = f"{os.fspath(path)}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=indent)
        os.replace(tmp, path)
    except BaseException:  # a full disk, an interrupt: no half file left behind
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
