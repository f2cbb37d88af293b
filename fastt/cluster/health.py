"""Is every server of a cluster answering? A ``GetStatus`` call to each, with a deadline.

TensorFlow waits for ever on a server that is gone when it creates a session, and a step that
needs one can hang; fastt asks each server itself (grpcio, TensorFlow's worker service) before
it opens sessions, every few seconds while training, and after a failed step, so a lost worker
becomes one clear error naming it. No TensorFlow here.
"""
from __future__ import annotations

import logging
import time
from typing import Sequence

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

    def check(self, force: bool = False, cause: BaseException | None = None) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        lost = unanswered(self.spec.tasks, self.timeout)
        self._last = time.monotonic()
        if not lost:
            return
        names = "; ".join(f"{t} does not answer ({why})" for t, why in lost)
        step = f" The step failed with {type(cause).__name__}: {_first_line(cause)}." \
            if cause is not None else ""
        raise WorkerLostError(
            f"cluster {self.spec.value}: {names}.{step} Checkpoints saved so far are intact; "
            "restart the worker (e.g. 'fastt cluster down' then 'fastt cluster up') and resume "
            "from the last one.") from cause


def _first_line(error: BaseException | None) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else ""
