"""Work done on a second core (``Aside``): a function called in a forked process while this
one goes on, its result read when it is needed.

It never changes a result, only when the work is done: where there is no second core or no
fork, where the child fails, dies or stops working (no processor time for ``IDLE_S``), the
function is called here instead, when its result is asked for. What the work logs through
the ``fastt`` logger is said by this process with the answer, once (nothing of a child that
failed). The result comes back pickled, so it suits work whose answer is small beside the
work (a table of op costs), not a graph.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import sys
import time
from multiprocessing.connection import Connection
from typing import Any, Callable, Generic, TypeVar

log = logging.getLogger("fastt")

T = TypeVar("T")
IDLE_S = 20.0  # a child that used no processor time for this long is taken as hung
POLL_S = 0.25


class Aside(Generic[T]):
    """``fn()``, begun in a forked child when there is a second core (``result`` waits for
    it), else called by ``result``."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn = fn
        self._done = False
        self._value: Any = None
        self._proc: Any = None
        self._conn: Connection | None = None
        if (os.cpu_count() or 1) < 2 or "fork" not in mp.get_all_start_methods():
            return
        for stream in (sys.stdout, sys.stderr):  # else the child writes them again
            stream.flush()
        ctx = mp.get_context("fork")
        here, there = ctx.Pipe(duplex=False)
        try:
            self._proc = ctx.Process(target=_child, args=(fn, there), daemon=True)
            self._proc.start()
        except OSError as e:  # no process to be had: done here
            log.debug("no second process (%s): the work is done here", e)
            self._proc = None
            here.close()
        else:
            self._conn = here
        finally:
            there.close()

    def result(self) -> T:
        """``fn()``: the child's answer, else called here."""
        if not self._done:
            value = self._from_child()
            self._value = self._fn() if value is _NONE else value
            self._done = True
        return self._value  # type: ignore[no-any-return]

    def __del__(self) -> None:  # never asked for: the child is not left behind
        if getattr(self, "_conn", None) is not None:
            self._stop()

    def _stop(self) -> None:
        """The child's pipe closed and the child gone (killed if still at work)."""
        conn, proc = self._conn, self._proc
        self._conn = self._proc = None
        if conn is not None:
            conn.close()
        if proc is not None:
            if proc.is_alive():
                proc.kill()
            proc.join()

    def _from_child(self) -> Any:
        conn, proc = self._conn, self._proc
        if conn is None:
            return _NONE
        try:
            busy, idle_since = _cpu_ticks(proc.pid), time.monotonic()
            while not conn.poll(POLL_S):
                if not proc.is_alive():
                    return _NONE
                now = _cpu_ticks(proc.pid)
                if now != busy:
                    busy, idle_since = now, time.monotonic()
                elif busy is not None and time.monotonic() - idle_since > IDLE_S:
                    log.debug("the second process stopped working: the work is done here")
                    return _NONE
            ok, answer = conn.recv()
            if not ok:
                return _NONE
            value, records = answer
            for record in records:
                logging.getLogger(record.name).handle(record)
            return value
        except (EOFError, OSError):
            return _NONE
        finally:
            self._stop()


_NONE: Any = object()  # no answer from the child


class _Kept(logging.Handler):
    """The records the child's ``fastt`` logger emits, kept to be said by the parent."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        record.msg, record.args = record.getMessage(), None  # sent pickled
        record.exc_info = record.exc_text = None
        self.records.append(record)


def _child(fn: Callable[[], Any], conn: Connection) -> None:
    # what the work says is said once, by the parent, with its answer (not if it fails)
    kept = _Kept()
    log.handlers, log.propagate = [kept], False
    try:
        conn.send((True, (fn(), kept.records)))
    except BaseException:  # noqa: BLE001 - said again by the call here
        try:
            conn.send((False, None))
        except OSError:
            pass
    finally:
        conn.close()


def _cpu_ticks(pid: int) -> int | None:
    """Processor time (user + system clock ticks) process ``pid`` has used, where the
    system says (``/proc``); None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None
