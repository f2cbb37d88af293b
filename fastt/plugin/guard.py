"""What keeps a user's step from hanging or failing without a word: a deadline on a new
graph's first step (a deadlock fastt caused fails instead, and training returns to the
original graph) and on every step on fastt's cluster (a server that hangs), whose servers are
checked every few seconds and after a failed step, so that a lost one is an error naming it."""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import tensorflow as tf

from fastt.cluster.health import StepWatch, Watch
from fastt.errors import WorkerLostError
from fastt.plugin import remote
from tf_patches import session_hook as hook

_tf1 = tf.compat.v1
FIRST_STEP_TIMEOUT_S = 120.0  # at least; 50 original steps when longer

_NOTHING = contextlib.nullcontext()


class Guard:
    """The deadlines and server checks of one user session (``watch``: on fastt's cluster;
    ``original_s``: the original graph's median step time, once measured)."""

    def __init__(self, watch: Watch | None, original_s: Callable[[], float | None]) -> None:
        self.watch, self.original_s = watch, original_s
        self.steps = StepWatch(watch, self._forsake) if watch is not None else None

    def running(self) -> contextlib.AbstractContextManager[None]:
        """Around a run on the cluster: a server lost while it runs is named within seconds
        (``StepWatch``), though TensorFlow ends the run only at its deadline (off a cluster:
        nothing, at no cost)."""
        return _NOTHING if self.steps is None else self._watched()

    @contextlib.contextmanager
    def _watched(self) -> Iterator[None]:
        assert self.steps is not None
        self.steps.started()
        try:
            yield
        finally:
            self.steps.ended()

    def check(self, force: bool = False) -> None:
        """On the cluster: every server answers (checked every few seconds, or now)."""
        if self.watch is not None:
            with self._lost():
                self.watch.check(force=force)

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
        hook.forsake(self.watch.spec.target)

    def options(self, options: Any, first: bool) -> Any:
        """The run options of a step (``first``: a new graph's first): with a deadline of
        at least ``FIRST_STEP_TIMEOUT_S`` and 50 original steps on a first step and on the
        cluster, unless the user set one; as the user gave them otherwise."""
        if not first and self.watch is None or options is not None and options.timeout_in_ms:
            return options
        limit = max(FIRST_STEP_TIMEOUT_S, 50 * (self.original_s() or 0.0))
        return with_fields(options, timeout_in_ms=int(1e3 * limit))


def with_fields(options: Any, **fields: Any) -> Any:
    """A copy of ``options`` (RunOptions, possibly None) with ``fields`` set."""
    opts = _tf1.RunOptions()
    if options is not None:
        opts.CopyFrom(options)
    for k, v in fields.items():
        setattr(opts, k, v)
    return opts
