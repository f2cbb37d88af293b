"""What keeps a user's step from hanging or failing without a word: a deadline on a new
graph's first step (a deadlock fastt caused fails instead, and training returns to the
original graph) and on every step on fastt's cluster (a server that hangs), whose servers are
checked every few seconds and after a failed step, so that a lost one is an error naming it,
or, with recovery on (``FASTT_ELASTIC``), a loss training goes on without."""
from __future__ import annotations

import contextlib
import threading
import queue
from typing import Any, Callable, Iterator

import tensorflow as tf

from fastt.cluster.health import StepWatch, Watch
from fastt.cluster.spec import Task
from fastt.errors import WorkerLostError
from fastt.op_types import USER_CODE
from fastt.plugin import remote
from tf_patches import session_hook as hook

_tf1 = tf.compat.v1
FIRST_STEP_TIMEOUT_S = 120.0  # at least; 50 original steps when longer

_NOTHING = contextlib.nullcontext()
RETRYABLE = (tf.errors.OutOfRangeError, tf.errors.CancelledError)  # the script's, not fastt's


def users_error(error: Exception, graph: tf.Graph, first: bool) -> bool:
    """Whether ``error``, raised by a step on one of fastt's graphs, is the script's own: it
    comes from an op of the script's code or checks (``USER_CODE``: a ``py_func``, an
    ``Assert``), or, after the graph's first step ran, from reading the script's input."""
    if not isinstance(error, tf.errors.OpError):
        return False
    name = error.node_def.name if error.node_def is not None else ""
    try:
        op = graph.get_operation_by_name(name)
    except (KeyError, ValueError):
        return False
    kinds = USER_CODE if first else USER_CODE | {"IteratorGetNext", "IteratorGetNextSync"}
    return op.type in kinds


class Guard:
    """The deadlines and server checks of one user session (``watch``: on fastt's cluster;
    ``original_s``: the original graph's median step time, once measured; ``survive``: with
    recovery on, goes on without the servers found lost, returning whether it did, or None
    when none is)."""

    def __init__(self, watch: Watch | None, original_s: Callable[[], float | None],
                 survive: Callable[[], bool | None] | None = None) -> None:
        self.watch, self.original_s, self.survive = watch, original_s, survive
        self.steps = StepWatch(watch, self._step_lost) if watch is not None else None
        self._runner: _Runner | None = None  # runs steps when they can be given up
        self._waiting: tuple[threading.Event, list[str]] | None = None  # the run waited for
        # the servers a run was given up for: lost, even should they answer again (a run
        # left on them may still write the old session's state)
        self.given_up: list[Task] = []

    def running(self) -> contextlib.AbstractContextManager[None]:
        """Around a run on the cluster: a server lost while it runs is named within seconds
        (``StepWatch``; ``run`` gives it up then) (off a cluster: nothing, at no cost)."""
        return _NOTHING if self.steps is None else self._watched()

    def run(self, fn: Callable[[], Any]) -> Any:
        """``fn()``, a run on the session: on a cluster, on a thread of its own, given up
        (``UnavailableError``) once a server is found lost while it runs, as TensorFlow
        would wait for the run's deadline (a minute or more); as it is otherwise."""
        with self.running():
            if self.steps is None:
                return fn()
            if self._runner is None:
                self._runner = _Runner()
            done, lost = threading.Event(), list[str]()
            self._waiting = (done, lost)
            try:
                call = self._runner.submit(fn, done)
                done.wait()
            finally:
                self._waiting = None
            if call.finished:
                return call.result()
            self._runner = None  # its thread ends when TensorFlow gives the run up
            raise tf.errors.UnavailableError(None, None, f"{lost[0]} while the run waited")

    def _step_lost(self, names: str) -> None:
        """A server is lost while a step runs: the step is given up; without recovery, the
        cluster's sessions close without calling it."""
        if self.survive is None:
            self._forsake(names)
        waiting = self._waiting
        if waiting is not None:
            assert self.watch is not None
            self.given_up += [t for t in self.watch.found if t not in self.given_up]
            waiting[1].append(names)
            waiting[0].set()

    @contextlib.contextmanager
    def _watched(self) -> Iterator[None]:
        assert self.steps is not None
        self.steps.started()
        try:
            yield
        finally:
            self.steps.ended()

    def check(self, force: bool = False) -> None:
        """On the cluster: every server answers (checked every few seconds, or now); with
        recovery on, training goes on without those that do not where it can."""
        if self.watch is None:
            return
        if self.survive is not None:
            if not force and not self.watch.due():
                return
            if self.survive() is not False:  # none lost, or training goes on without it
                return
        with self._lost():
            self.watch.check(force=True if self.survive is not None else force)

    def failed(self, error: BaseException) -> None:
        """After a step failed with ``error``: on the cluster, a ``WorkerLostError`` naming
        each server that does not answer."""
        if self.watch is not None and isinstance(error, remote.STEP_ERRORS):
            with self._lost():
                self.watch.check(force=True, cause=error)

    @contextlib.contextmanager
    def _lost(self) -> Iterator[None]:
        try:
            yield
        except WorkerLostError:
            self._forsake("")
            raise

    def _forsake(self, _names: str) -> None:
        """A server is lost: the cluster's sessions close without calling it."""
        assert self.watch is not None
        hook.forsake(self.watch.target)

    def options(self, options: Any, first: bool) -> Any:
        """The run options of a step (``first``: a new graph's first): with a deadline of
        at least ``FIRST_STEP_TIMEOUT_S`` and 50 original steps on a first step and on the
        cluster, unless the user set one; as the user gave them otherwise."""
        if not first and self.watch is None or options is not None and options.timeout_in_ms:
            return options
        limit = max(FIRST_STEP_TIMEOUT_S, 50 * (self.original_s() or 0.0))
        return with_fields(options, timeout_in_ms=int(1e3 * limit))


class _Call:
    def __init__(self, fn: Callable[[], Any], done: threading.Event) -> None:
        self.fn, self.done, self.finished = fn, done, False
        self._value: Any = None
        self._error: BaseException | None = None

    def __call__(self) -> None:
        try:
            self._value = self.fn()
        except BaseException as e:  # noqa: BLE001 - raised where the result is read
            self._error = e
        self.finished = True
        self.done.set()

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


class _Runner:
    """One daemon thread running calls in turn: a run it is stuck in never holds up the
    interpreter's exit (a thread pool's would be joined there, until TensorFlow's deadline)."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="fastt-run", daemon=True).start()

    def submit(self, fn: Callable[[], Any], done: threading.Event) -> _Call:
        call = _Call(fn, done)
        self._calls.put(call)
        return call

    def _loop(self) -> None:
        while True:
            self._calls.get()()


def with_fields(options: Any, **fields: Any) -> Any:
    """A copy of ``options`` (RunOptions, possibly None) with ``fields`` set."""
    opts = _tf1.RunOptions()
    if options is not None:
        opts.CopyFrom(options)
    for k, v in fields.items():
        setattr(opts, k, v)
    return opts
