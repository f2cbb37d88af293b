"""Sessions and steps in several threads (no TensorFlow here).

TensorFlow has one profiler per process: two traced runs at once fail the second
("Another profiling session active"), so a step is traced only when no other traced run of
fastt's is under way (``trace_slot``; ``fastt.profiler.TRACING``). A training step run by
several threads at once (Hogwild style) cannot be timed or switched to another graph one
step at a time: ``StepThreads`` tells when it happens, and fastt steps aside for that
session.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

from fastt.profiler import TRACING


@contextlib.contextmanager
def trace_slot(wanted: bool) -> Iterator[bool]:
    """Whether this step may be traced: ``wanted`` and no other step is being traced (the
    step is then run untraced rather than waiting: the other may wait on this one)."""
    got = wanted and TRACING.acquire(blocking=False)
    try:
        yield got
    finally:
        if got:
            TRACING.release()


class StepThreads:
    """The threads inside a session's training step now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside: dict[int, int] = {}  # thread -> depth

    def enter(self) -> bool:
        """The calling thread starts a training step; whether another thread is inside one."""
        me = threading.get_ident()
        with self._lock:
            others = any(t != me for t in self._inside)
            self._inside[me] = self._inside.get(me, 0) + 1
            return others

    def leave(self) -> None:
        me = threading.get_ident()
        with self._lock:
            depth = self._inside.get(me, 0) - 1
            if depth > 0:
                self._inside[me] = depth
            else:
                self._inside.pop(me, None)


class Background:
    """``fn`` computed on a thread of its own (a daemon: a plan still being computed never
    holds up the script's exit); the training thread polls ``done``."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(fn,), name="fastt-plan", daemon=True).start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self._value = fn()
        except BaseException as e:  # noqa: BLE001 - raised on the training thread
            self._error = e
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(None if timeout == float("inf") else timeout)

    def result(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value
