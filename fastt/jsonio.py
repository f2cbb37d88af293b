"""Reading and writing the files fastt is given, with errors that name the file and what
was wrong with it.

``read_json`` turns a missing, unreadable, empty, non-UTF-8 or non-JSON file (and a document
of the wrong JSON type) into a ``FasttError``; ``interpreting`` does the same for a document
whose parts have the wrong shape; ``writing`` and ``check_output`` for an output location
that cannot be written.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any, Iterator

from fastt.errors import FasttError

_KINDS = {dict: "an object", list: "an array", str: "a string", bool: "true or false",
          int: "a number", float: "a number", type(None): "null"}


def json_kind(value: Any) -> str:
    """What ``value`` is in JSON's words (``an object``, ``an array``...)."""
    return _KINDS.get(type(value), type(value).__name__)


def read_bytes(path: str | os.PathLike[str], what: str,
               error: type[FasttError] = FasttError, limit: int = -1) -> bytes:
    """The bytes of file ``path`` (the first ``limit``, when it is >= 0); ``error`` naming
    ``what`` the file is when it is missing, a directory, unreadable or empty."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            data = f.read(limit)
    except FileNotFoundError:
        raise error(f"{what} {p!r} does not exist") from None
    except IsADirectoryError:
        raise error(f"{what} {p!r} is a directory, not a file") from None
    except OSError as e:
        raise error(f"{what} {p!r} cannot be read: {e.strerror or e}") from None
    if not data:
        raise error(f"{what} {p!r} is empty")
    return data


def read_text(path: str | os.PathLike[str], what: str,
              error: type[FasttError] = FasttError) -> str:
    """The UTF-8 text of file ``path``; ``error`` naming ``what`` the file is when it cannot
    be read (``read_bytes``) or is not UTF-8."""
    data = read_bytes(path, what, error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} {os.fspath(path)!r} is not UTF-8 text (byte "
                    f"{data[e.start]:#04x} at offset {e.start})") from None


def read_json(path: str | os.PathLike[str], what: str,
              error: type[FasttError] = FasttError, expect: type | None = None) -> Any:
    """The parsed JSON at ``path``; ``error`` naming ``what`` the file is when it cannot be
    read as JSON text (``read_text``) or, with ``expect`` (``dict``, ``list``), when the
    document is not of that type."""
    p = os.fspath(path)
    text = read_text(p, what, error)
    if not text.strip():
        raise error(f"{what} {p!r} is empty")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{what} {p!r} is not JSON: {e}") from None
    if expect is not None and not isinstance(doc, expect):
        raise error(f"{what} {p!r} holds {json_kind(doc)}, expected {_KINDS[expect]}")
    return doc


# What reading a document of the wrong shape raises: a key missing, a value of the wrong
# type (a list where an object belongs, a string where a number does).
SHAPE_ERRORS = (KeyError, IndexError, TypeError, ValueError, AttributeError)


@contextlib.contextmanager
def interpreting(path: str | os.PathLike[str], what: str,
                 error: type[FasttError] = FasttError) -> Iterator[None]:
    """Around the reading of a document loaded from ``path``: a ``SHAPE_ERRORS`` exception
    becomes ``error`` naming the file (the original chained, for a debugger)."""
    try:
        yield
    except FasttError:
        raise
    except SHAPE_ERRORS as e:
        detail = f"missing key {e}" if isinstance(e, KeyError) else str(e)
        detail = f"{type(e).__name__}: {detail}"
        raise error(f"{what} {os.fspath(path)!r}: {detail}") from e


@contextlib.contextmanager
def writing(path: str | os.PathLike[str], what: str,
            error: type[FasttError] = FasttError) -> Iterator[None]:
    """Around writes to ``path`` (a file or a directory): an ``OSError`` becomes ``error``
    naming ``what`` is written, and the file that failed when it is another one."""
    try:
        yield
    except OSError as e:
        p = os.fspath(path)
        # a rename's target, else the file the call named, else the path itself
        named = e.filename2 if e.filename2 is not None else e.filename
        failed = os.fspath(named) if named is not None else p
        where = "" if failed == p else f" ({failed!r})"
        raise error(f"cannot write {what} {p!r}{where}: {e.strerror or e}") from None


def check_output(path: str | os.PathLike[str], what: str, directory: bool = False,
                 parents: bool = False, error: type[FasttError] = FasttError) -> None:
    """Before long work whose result goes to ``path``: ``error`` when it cannot be written
    there (a file where a directory belongs or the reverse, a parent that is a file or is
    missing, a place where nothing can be created). ``directory``: ``path`` is a directory,
    made with its parents when missing; ``parents``: a file whose missing parents are made.
    Tried, not guessed from permission bits (which do not bind root): nothing is left
    behind."""
    p = os.fspath(path)
    if not p:
        raise error(f"{what}: the path is empty")
    if os.path.isdir(p):
        if not directory:
            raise error(f"cannot write {what} {p!r}: it is a directory")
        return _try_create(p, what, p, error)
    if os.path.lexists(p):
        if directory:
            raise error(f"cannot write {what} {p!r}: it exists and is not a directory")
        if os.path.isfile(p):  # opened for writing, not truncated
            try:
                os.close(os.open(p, os.O_WRONLY))
            except OSError as e:
                raise error(f"cannot write {what} {p!r}: {e.strerror or e}") from None
        return None
    parent = os.path.dirname(os.path.abspath(p))
    while (directory or parents) and not os.path.lexists(parent):  # made with its parents
        parent = os.path.dirname(parent)
    if not os.path.lexists(parent):
        raise error(f"cannot write {what} {p!r}: directory {parent!r} does not exist")
    if not os.path.isdir(parent):
        raise error(f"cannot write {what} {p!r}: {parent!r} is not a directory")
    return _try_create(parent, what, p, error)


def _try_create(folder: str, what: str, path: str, error: type[FasttError]) -> None:
    """``error`` unless an entry can be created in ``folder`` (one is, and removed)."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".fastt-check-", dir=folder))
    except OSError as e:
        where = "" if folder == path else f" (in directory {folder!r})"
        raise error(f"cannot write {what} {path!r}: {e.strerror or e}{where}") from None


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
