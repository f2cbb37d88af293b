"""Checkpoint-restart activation: a graph in a session of its own, with the training's state.

TensorFlow cannot change the graph of a session that has run, so each strategy runs in an
inner session on its rewritten graph. ``Running`` is one such graph and session; ``start``
builds it and carries the state over from the running one (``fastt.plugin.state``); nothing
changes until the new session holds the state, so a failure leaves the old one running.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Iterator, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from fastt.ir import Graph
from fastt.passes.allreduce import followers
from fastt.plugin.state import State, StateOps, executed, has_op
from fastt.plugin.streams import StreamCounter
from tf_patches import session_hook as hook

log = logging.getLogger("fastt")
_tf1 = tf.compat.v1


class Running:
    """A graph the user's session is served from: the user's own session (``inner=False``)
    or an inner session fastt opened."""

    def __init__(self, strategy: Any, graph: tf.Graph, sess: Any, state: StateOps,
                 profile_graph: Graph, inner: bool, streams: StreamCounter | None = None
                 ) -> None:
        self.strategy, self.graph, self.sess = strategy, graph, sess
        self.state, self.profile_graph, self.inner = state, profile_graph, inner
        self.streams = streams  # the user's session: its random ops' draws, counted
        self.fifo = False  # its strategy runs in TensorFlow's own order (none enforced)
        self._elements: dict[str, Any] = {}
        # The state it started with, until its first step succeeds: a first step that fails
        # part-way (or never ends) may have updated some variables.
        self.snapshot: State | None = None
        self.callables: dict[tuple[Any, ...], Any] = {}  # (callable, traced, extra fetches)
        self._followers: dict[str, list[str]] | None = None
        self._syncs: dict[Any, list[str]] = {}
        self._lock = threading.Lock()
        self._runs, self._closing = 0, False  # runs in progress; closed once they end

    def element(self, name: str) -> Any:
        e = self._elements.get(name)
        if e is None:
            e = self._elements[name] = self.graph.as_graph_element(name)
        return e

    def has(self, name: str) -> bool:
        """Whether this graph has the op of ``name`` (an op or tensor name)."""
        return name in self._elements or has_op(self.graph, name.split(":")[0])

    def run(self, fetches: Any, feed_dict: Any = None) -> Any:
        """TensorFlow's own run on this session (never the plugin's)."""
        return hook.original("run")(self.sess, fetches, feed_dict)

    def serve(self, fetches: list[str], targets: list[str], feeds: dict[str, Any],
              options: Any = None, run_metadata: Any = None) -> list[Any]:
        """One run of the user's, by names of this graph's elements (the mirrored copies'
        ``followers`` run with it); the fetched values."""
        found = [self.element(n) for n in fetches + targets]
        syncs = self.followers(fetches, targets, feeds)
        return hook.run_elements(
            self.sess, found[:len(fetches)], found[len(fetches):] + syncs,
            {self.element(n): v for n, v in feeds.items()}, options, run_metadata)

    def capture(self) -> State:
        state = self.state.capture(self.run)
        if self.streams is not None:
            state.values.update(self.streams.values())
        return state

    def followers(self, fetches: list[str], targets: list[str], feeds: Any) -> list[Any]:
        """The ops that copy what a run's writes wrote into the variables' mirrored copies,
        when the run does not run them itself (a variable's initializer or assign fetched
        alone; a group of them runs them already)."""
        if self._followers is None:
            self._followers = followers(op.name for op in self.graph.get_operations())
        if not self._followers:
            return []
        key = (tuple(fetches), tuple(targets), tuple(sorted(feeds)))
        if key not in self._syncs:
            ran = executed(self.graph, fetches, targets, set(feeds))
            self._syncs[key] = [f for w in ran if w in self._followers
                                for f in self._followers[w] if f not in ran]
        return [self.element(f) for f in self._syncs[key]]

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """A run on this session: closing it waits until the last such run ended (another
        thread's step may be running when fastt switches graphs)."""
        with self._lock:
            self._runs += 1
        try:
            yield
        finally:
            with self._lock:
                self._runs -= 1
                now = self._closing and not self._runs
            if now:
                self._close_now()

    def close(self) -> None:
        if self.inner:
            with self._lock:
                self._closing = True
                now = not self._runs
            if now:
                self._close_now()

    def _close_now(self) -> None:
        self.callables.clear()
        try:
            self.sess.close()
        except tf.errors.OpError as e:  # fastt's own session: its close never fails a run
            log.debug("fastt: closing a session of its own: %s: %s", type(e).__name__,
                      str(e).strip().splitlines()[0] if str(e).strip() else "")


def open_session(target: str, graph: tf.Graph, config: Any) -> Any:
    """A plain TensorFlow session (no plugin) on ``graph``."""
    with hook.plain_sessions():
        return _tf1.Session(target, graph=graph, config=config)


def start(graph_def: graph_pb2.GraphDef, strategy: Any, profile_graph: Graph,
          target: str, config: Any, current: Running, variables: list[str],
          iterators: list[str], initializers: list[str], counters: Sequence[str] = (),
          iterator_inits: dict[str, tuple[str, dict[str, Any]]] | None = None,
          state: State | None = None) -> Running:
    """An inner session on ``graph_def`` holding ``current``'s state, or ``state`` where
    given (variables, iterator positions, after the initializer each last ran,
    ``iterator_inits``; the ``counters`` of random streams, from 0 where the state has none;
    ``initializers``, e.g. lookup tables, re-run)."""
    g = tf.Graph()
    with g.as_default():
        _tf1.import_graph_def(graph_def, name="")
    sess = open_session(target, g, config)
    new = Running(strategy, g, sess, StateOps(g, variables + list(counters), iterators),
                  profile_graph, True)
    try:
        if state is None:
            state = current.snapshot if current.snapshot is not None else current.capture()
        fresh = {c: np.int64(0) for c in counters if c not in state.values}
        new.state.restore(new.run, State({**state.values, **fresh}, state.iterators),
                          iterator_inits)
        new.snapshot = state
        present = [n for n in initializers if has_op(g, n)]
        if present:
            new.run(present)
    except BaseException:
        sess.close()
        raise
    return new

