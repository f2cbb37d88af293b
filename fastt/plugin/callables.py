"""The user's session callables (``Session._make_callable_from_options``, through which
tf-keras runs its steps): each runs on whichever session currently serves the user's, traced
when the controller asks, like ``SessionPlugin.run``."""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterable, Protocol

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from fastt.plugin.activation import Running
from fastt.plugin.controller import Controller
from fastt.plugin.elastic import Snapshots
from fastt.plugin.guard import Guard
from fastt.plugin.settings import Settings
from fastt.plugin.step_finder import StepDetector
from fastt.plugin.streams import StreamCounter
from fastt.plugin.threads import StepThreads, trace_slot
from tf_patches import session_hook as hook
from tf_patches.quiet import profiler_chatter_dropped

_tf1 = tf.compat.v1


class Host(Protocol):
    """What a callable uses of the session plugin it runs for (``SessionPlugin``)."""
    settings: Settings
    guard: Guard
    lock: threading.RLock  # the plugin's state
    detector: StepDetector
    steps: StepThreads
    streams: StreamCounter
    user: Running  # the user's own session
    current: Running  # the graph that serves the user's runs
    snapshots: Snapshots | None  # kept for recovery from a lost device

    def step_controller(self, signature: Any, names: list[str]) -> Controller | None: ...
    def step_fed(self, names: Iterable[str], values: Iterable[Any]) -> None: ...
    def resolve(self, names: list[str]) -> Running: ...
    def survived(self, cur: Running | None, error: Exception | None) -> bool | None: ...
    def recovered(self, cur: Running, error: Exception) -> bool: ...
    def verify(self, cur: Running, fetches: list[str], targets: list[str],
               feeds: dict[str, Any], values: list[Any]) -> None: ...


class StepCallable:
    """What ``_make_callable_from_options`` returns while fastt serves the session."""

    def __init__(self, plugin: Host, options: Any) -> None:
        self.plugin, self.options = plugin, options
        self.names = list(options.fetch) + list(options.target)
        self.signature = (tuple(sorted(options.fetch)), tuple(sorted(options.target)),
                          tuple(sorted(options.feed)))

    def __call__(self, *args: Any, run_metadata: Any = None) -> Any:
        return call(self.plugin, self, args, run_metadata)


def call(p: Host, c: StepCallable, args: tuple[Any, ...], run_metadata: Any) -> Any:
    """``c(*args)`` on ``p``'s current session; the controller sees it when it is the
    training step."""
    p.guard.check()
    with p.lock:
        if not p.detector.off:
            p.step_fed(c.options.feed, args)
        ctl = p.step_controller(c.signature, c.names) if not p.detector.off else None
    try:
        return _call(p, c, args, run_metadata, ctl)
    finally:
        if ctl is not None:
            p.steps.leave()


def _call(p: Host, c: StepCallable, args: tuple[Any, ...], run_metadata: Any,
          ctl: Any) -> Any:
    with p.lock:
        if ctl is not None:
            ctl.step_started()
        wanted = ctl.before_step() if ctl else False
    with trace_slot(wanted) as trace, contextlib.ExitStack() as running:
        with p.lock:
            cur = p.current
            skey, extra = (p.streams.extra(list(c.options.fetch), list(c.options.target),
                                           list(c.options.feed))
                           if cur is p.user else (None, []))
            key = (c, trace, tuple(t.name for t in extra))
            fn = cur.callables.get(key)
            if fn is None:
                cur, fn = _make(p, c, cur, trace, extra)
                cur.callables[key] = fn
            running.enter_context(cur.in_use())
        meta = _tf1.RunMetadata() if trace else run_metadata
        retry = False
        try:
            with profiler_chatter_dropped() if trace else contextlib.nullcontext():
                out = p.guard.run(lambda: fn(*args, run_metadata=meta))
            if cur.snapshot is not None and cur.strategy is not None and p.settings.verify:
                with p.lock:
                    p.verify(cur, list(c.options.fetch), list(c.options.target),
                             dict(zip(c.options.feed, args)), list(out))
            if p.snapshots is not None:
                p.snapshots.ran(list(c.options.fetch), list(c.options.target),
                                dict(zip(c.options.feed, args)))
        except Exception as e:  # noqa: BLE001 - back to the original graph, then retry once
            with p.lock:
                if not (p.survived(cur, e) or p.recovered(cur, e)):
                    raise
            retry = True
    if retry:  # the failed step was not fastt's to time
        return _call(p, c, args, run_metadata, None)
    with p.lock:
        if skey is not None:
            p.streams.count(skey, out[len(out) - len(extra):])
            out = out[:len(out) - len(extra)]
        cur.snapshot = None
        if ctl is not None:
            if trace and run_metadata is not None:
                run_metadata.MergeFrom(meta)
            ctl.after_step(meta if trace else None)
    return out


def _make(p: Host, c: StepCallable, cur: Any, trace: bool, extra: list[Any]
          ) -> tuple[Any, Any]:
    """The session that will run ``c`` (after a re-activation on a grown graph) and ``c``'s
    TensorFlow callable on it."""
    if cur is not p.user:
        cur = p.resolve(c.names + list(c.options.feed))
    opts = config_pb2.CallableOptions()
    opts.CopyFrom(c.options)
    if trace:
        opts.run_options.trace_level = config_pb2.RunOptions.FULL_TRACE
    opts.run_options.CopyFrom(p.guard.options(opts.run_options, cur is not p.user))
    if cur is p.user:
        opts.fetch.extend(t.name for t in extra)
        return cur, hook.original("_make_callable_from_options")(cur.sess, opts)
    return cur, hook.plain_callable(cur.sess, opts)
