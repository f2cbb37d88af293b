"""Is every server of a cluster answering? A ``GetStatus`` call to each, with a deadline.

TensorFlow waits for ever on a server that is gone when it creates a session, and a step that
needs one can hang; fastt asks each server itself (grpcio, TensorFlow's worker service) before
it opens sessions, every few seconds while training, and after a failed step, so a lost worker
becomes one clear error naming it. No TensorFlow here.
"""
from __future__ import annotations

import atexit
import logging
import threading
import time
from typing import Callable, Sequence

import grpc

from fastt.cluster.spec import ClusterSpec, Task
from fastt.errors import WorkerLostError

log = logging.getLogger("fastt")
_GET_STATUS = "/tensorflow.WorkerService/GetStatus"


def ping(address: str, timeout: float = 10.0) -> float:
    """Seconds a ``GetStatus`` round trip to ``address`` took; ``grpc.RpcError`` when the
    server does not answer within ``timeout``."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(_GET_STATUS, request_serializer=bytes,
                                   response_deserializer=bytes)
        t0 = time.perf_counter()
        call(b"", timeout=timeout)  # an empty GetStatusRequest is a valid one
        return time.perf_counter() - t0


def unanswered(tasks: Sequence[Task], timeout: float = 10.0) -> list[tuple[Task, str]]:
    """The tasks that do not answer, each with why."""
    lost = []
    for t in tasks:
        try:
            ping(t.address, timeout)
        except grpc.RpcError as e:
            detail = e.details() if hasattr(e, "details") else str(e)
            code = e.code().name if hasattr(e, "code") else "ERROR"
            lost.append((t, f"{code}: {detail}"))
    return lost


class Watch:
    """Checks a cluster at most every ``interval`` seconds (or when forced); raises
    ``WorkerLostError`` naming every task that does not answer."""

    def __init__(self, spec: ClusterSpec, interval: float = 5.0, timeout: float = 10.0) -> None:
        self.spec, self.interval, self.timeout = spec, interval, timeout
        self._last = -float("inf")
        self.gone: set[Task] = set()  # tasks training went on without (``forget``)
        self.found: list[Task] = []  # those the last check found lost
        self.lost_any = False  # training went on without a server once (it may be back)

    @property
    def tasks(self) -> list[Task]:
        """The tasks training runs on: the cluster's, less those forgotten."""
        return [t for t in self.spec.tasks if t not in self.gone]

    @property
    def master(self) -> Task:
        """The task whose master the sessions talk to: the cluster's, else the first left."""
        m = self.spec.master
        return m if m not in self.gone else self.tasks[0]

    @property
    def target(self) -> str:
        return f"grpc://{self.master.address}"

    def due(self) -> bool:
        """Whether ``interval`` has passed since the servers were last asked."""
        return time.monotonic() - self._last >= self.interval

    def forget(self, tasks: Sequence[Task]) -> None:
        """Training goes on without ``tasks`` (lost): they are no longer checked."""
        self.gone.update(tasks)
        self.lost_any = self.lost_any or bool(tasks)

    def lost(self) -> str:
        """Every task that does not answer now, named with why ("" when all answer)."""
        found = unanswered(self.tasks, self.timeout)
        self._last, self.found = time.monotonic(), [t for t, _ in found]
        return "; ".join(f"{t} does not answer ({why})" for t, why in found)

    def lost_tasks(self, known: Sequence[Task] = ()) -> list[Task]:
        """The tasks that do not answer now, ``known`` lost among them without asking."""
        asked = [t for t in self.tasks if t not in known]
        self._last = time.monotonic()
        self.found = [t for t in self.tasks if t in known] + \
            [t for t, _ in unanswered(asked, self.timeout)]
        return self.found

    def check(self, force: bool = False, cause: BaseException | None = None) -> None:
        if not force and not self.due():
            return
        names = self.lost()
        if not names:
            return
        step = f" The step failed with {type(cause).__name__}: {_first_line(cause)}." \
            if cause is not None else ""
        raise WorkerLostError(
            f"cluster {self.spec.value}: {names}.{step} Checkpoints saved so far are intact; "
            "restart the worker (e.g. 'fastt cluster down' then 'fastt cluster up') and resume "
            "from the last one.") from cause


class Returns:
    """The servers training went on without (``Watch.gone``), asked from a thread of its own
    every ``watch.interval`` whether they answer again (restarted, or resumed), so that no
    step waits for one still stopped; ``take`` hands over those that do."""

    def __init__(self, watch: Watch, timeout: float = 1.0) -> None:
        self.watch, self.timeout = watch, timeout
        self._back: set[Task] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def take(self) -> list[Task]:
        """The servers gone that answered since last asked, in the cluster's order: back in
        ``watch.tasks`` from now on (the thread starts at the first call with some gone)."""
        if not self.watch.gone:
            return []
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="fastt-returns",
                                            daemon=True)
            self._thread.start()
            atexit.register(self._stopped.set)
        with self._lock:
            back = [t for t in self.watch.spec.tasks if t in self._back and t in self.watch.gone]
            self._back.clear()
        self.watch.gone.difference_update(back)
        return back

    def _loop(self) -> None:
        while not self._stopped.wait(self.watch.interval):
            gone = list(self.watch.gone)
            if not gone:
                continue
            lost = {t for t, _ in unanswered(gone, self.timeout)}
            with self._lock:
                self._back.update(t for t in gone if t not in lost)


class StepWatch:
    """While a step runs on the cluster for longer than ``watch.interval``, its servers are
    checked every interval from a thread of its own: a lost one is said at once, naming it
    (TensorFlow retries a lost server until the step's deadline, a minute or more), and
    ``on_lost``, if given, is called, once per step (the session plugin gives the step up
    then, rather than wait for TensorFlow's error)."""

    def __init__(self, watch: Watch, on_lost: Callable[[str], None] | None = None) -> None:
        self.watch, self.on_lost = watch, on_lost
        self._since: float | None = None  # when the step running started
        self.said = ""  # the loss said, once per step
        self._said_for: float | None = None  # the step it was said for
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def started(self) -> None:
        self._since = time.monotonic()
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="fastt-watch", daemon=True)
            self._thread.start()
            atexit.register(self.stop)  # no gRPC call while the interpreter shuts down

    def stop(self) -> None:
        """The thread ends within an interval (at exit)."""
        self._stopped.set()

    def ended(self) -> None:
        self._since = None

    def _loop(self) -> None:
        while not self._stopped.wait(self.watch.interval):
            since = self._since
            if since is None or since == self._said_for or \
                    time.monotonic() - since < self.watch.interval:
                continue
            names = self.watch.lost()
            if names and self._since == since:
                self.said, self._said_for = names, since
                log.warning("fastt: cluster %s: %s while a step runs; fastt gives the "
                            "step up", self.watch.spec.value, names)
                if self.on_lost is not None:
                    self.on_lost(names)


def _first_line(error: BaseException | None) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else ""
