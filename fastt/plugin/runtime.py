"""The plugin behind one user ``Session``: serves its runs on whichever session runs the
current strategy, finds the training step, and drives its ``Controller`` around each step
(whose TensorFlow side is ``fastt.plugin.backend``).

Until a strategy is active every call goes to the user's own session unchanged. Afterwards the
user's fetches and feeds (every form ``Session.run`` takes) are resolved in the user's graph,
named, and run on the inner session, whose graph has the same names; results come back in the
user's structure. ``sess.graph`` stays the user's graph.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import time
import weakref
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from fastt.adapters.engine import Engine
from fastt.cluster.health import Watch
from fastt.inspect import dumps
from fastt.plugin import dump, remote
from fastt.plugin.activation import Running
from fastt.plugin.backend import PluginBackend
from fastt.plugin.controller import Controller, session_id, updates_trainables
from fastt.plugin.input_stage import InputStage, fed_name
from fastt.plugin.settings import Settings
from fastt.plugin.state import SCOPE, IteratorInits, RunFanIn, StateOps, stateful_ops
from fastt.plugin.step_finder import DECLINE_AFTER_RUNS, StepFinder
from fastt.plugin.streams import StreamCounter
from fastt.ir import Graph
from tf_patches import session_hook as hook
from tf_patches.quiet import profiler_chatter_dropped

log = logging.getLogger("fastt")
_tf1 = tf.compat.v1
_RETRYABLE = (tf.errors.OutOfRangeError, tf.errors.CancelledError)
FIRST_STEP_TIMEOUT_S = 120.0  # at least; 50 original steps when longer
_open: "weakref.WeakSet[SessionPlugin]" = weakref.WeakSet()  # closed at exit if still open


@atexit.register
def _close_at_exit() -> None:
    """Sessions a script never closes (tf-keras keeps its own open) still record what they
    tried and say how they ended."""
    for plugin in list(_open):
        with contextlib.suppress(Exception):  # the interpreter is going away
            plugin.close()


class SessionPlugin:
    def __init__(self, sess: Any, target: str, config: Any, settings: Settings) -> None:
        self.sess, self.graph, self.target = sess, sess.graph, target
        self.config = config
        self.settings = settings
        cluster = settings.cluster
        # On fastt's cluster: every server is checked before sessions open on it, every few
        # seconds, and after a failed step, so that a lost one is an error naming it.
        self.watch = Watch(cluster) if cluster and target == cluster.target else None
        self.controller: Controller | None = None
        # the pipeline on the user's graph (fastt's own state reads left out); its devices
        # and training step are set once the step is found
        self.engine = Engine(self.graph, [], [], exclude=SCOPE)
        self.finder = StepFinder(self._updates_trainables)
        self.session = session_id()
        self._off = False
        self._declined = ""  # the record written when fastt said it does not plan
        self._closed = False
        self.feed_shapes: dict[str, tuple[int, ...]] = {}  # of the step's first run
        variables, iterators = stateful_ops(self.graph)
        fan_in = RunFanIn(self.graph)  # what each run signature executes, found once
        self.streams = StreamCounter(self.graph, fan_in)
        self.inputs = InputStage(self.graph, fan_in)
        self.iterator_inits = IteratorInits(self.graph, fan_in)
        self.user = Running(None, self.graph, sess, StateOps(self.graph, variables, iterators),
                            Graph([]), inner=False, streams=self.streams)
        _open.add(self)
        self.current = self.user

    # -- the user's calls ----------------------------------------------------------------
    def run(self, fetches: Any, feed_dict: Any, options: Any, run_metadata: Any) -> Any:
        if self.watch is not None:
            self.watch.check()
        if self.current is self.user and self._off:
            return self._user_run(fetches, feed_dict, options, run_metadata)
        try:
            req = hook.request(self.graph, fetches, feed_dict)
        except Exception:  # noqa: BLE001 - TensorFlow's own run says what is wrong
            if self.current is self.user:
                return self._user_run(fetches, feed_dict, options, run_metadata)
            raise
        if self.inputs.owns(req.fetch_names + req.target_names):  # a queue runner's thread
            return self._user_run(fetches, feed_dict, options, run_metadata)
        self.iterator_inits.see(req.fetch_names, req.target_names, req.feeds)
        ctl = self._controller_for(req.signature, req.fetch_names + req.target_names)
        if ctl is None:
            return self._dispatch(req, fetches, feed_dict, options, run_metadata)
        if self.engine.models is None:
            self.feed_shapes = {n: v.shape for n, v in req.feeds.items()}
        ctl.step_started(time.perf_counter())
        trace = ctl.before_step()
        meta = _tf1.RunMetadata() if trace else run_metadata
        opts = _with(options, trace_level=_tf1.RunOptions.FULL_TRACE) if trace else options
        with profiler_chatter_dropped() if trace else contextlib.nullcontext():
            out = self._dispatch(req, fetches, feed_dict, opts, meta)
        if trace and run_metadata is not None:
            run_metadata.MergeFrom(meta)
        ctl.after_step(meta if trace else None)
        return out

    def _dispatch(self, req: hook.Request, fetches: Any, feed_dict: Any, options: Any,
                  meta: Any) -> Any:
        if self.current is self.user:
            key, shapes = self.streams.extra(req.fetch_names, req.target_names, list(req.feeds))
            if not shapes:
                out = self._user_run(fetches, feed_dict, options, meta)
            else:  # the shapes its random ops drew, fetched with it
                out, drawn = self._user_run([fetches, shapes], feed_dict, options, meta)
            self.streams.count(key, drawn if shapes else [])
            return out
        reads = self.inputs.reads(req.fetch_names, req.target_names, list(req.feeds))
        if reads:  # from the queues in the user's session; a retry reuses them
            req.feeds.update(zip([fed_name(t.name) for t in reads], self.user.run(reads)))
        cur, found = self._resolve(req.fetch_names + req.target_names + list(req.feeds))
        nf, nt = len(req.fetch_names), len(req.target_names)
        first = cur.snapshot is not None
        try:
            values = hook.run_elements(
                cur.sess, found[:nf], found[nf:nf + nt],
                dict(zip(found[nf + nt:], req.feeds.values())),
                self._deadline(options, first), meta)
            if first:
                cur.snapshot = None
        except Exception as e:  # noqa: BLE001 - back to the original graph, then retry once
            if not self._recovered(cur, e):
                raise
            return self._dispatch(req, fetches, feed_dict, options, meta)
        return hook.build_results(self.sess, req, values)

    def _user_run(self, fetches: Any, feed_dict: Any, options: Any, meta: Any) -> Any:
        """TensorFlow's own run on the user's session (bounded and watched on a cluster)."""
        try:
            return hook.original("run")(self.sess, fetches, feed_dict,
                                        self._deadline(options, False), meta)
        except remote.STEP_ERRORS as e:
            self._check_cluster(e)
            raise

    def _check_cluster(self, error: Exception) -> None:
        """On fastt's cluster, after a step failed with ``error``: a ``WorkerLostError``
        naming each server that does not answer."""
        if self.watch is not None and isinstance(error, remote.STEP_ERRORS):
            self.watch.check(force=True, cause=error)

    def _recovered(self, cur: Running, error: Exception) -> bool:
        """After ``error`` on a planned graph, back to the original graph (state from before
        the failed step); whether to retry the call there. The end of the data and
        cancellations are the user's, not fastt's; a lost server is an error."""
        self._check_cluster(error)
        if cur.strategy is None or self.controller is None or isinstance(error, _RETRYABLE):
            return False
        self.controller.fail(error)
        return self.current is not cur

    def _deadline(self, options: Any, first: bool) -> Any:
        """The run options of a step: bounded on a new graph's first step and on a cluster
        (a server that hangs), as the user gave them otherwise."""
        return self._bounded(options) if first or self.watch is not None else options

    def _bounded(self, options: Any) -> Any:
        """``options`` with a deadline: a step on a new graph that never ends (a deadlock
        fastt caused) fails instead, and training returns to the original graph."""
        if options is not None and options.timeout_in_ms:
            return options
        orig = self.controller.original_median_s if self.controller else None
        return _with(options, timeout_in_ms=int(1e3 * max(FIRST_STEP_TIMEOUT_S,
                                                          50 * (orig or 0.0))))

    def _resolve(self, names: list[str]) -> tuple[Running, list[Any]]:
        """The running graph and its elements named ``names``; when the user added ops after
        the activation, fastt first re-activates on the grown graph, so that every element
        comes from the session that will run them."""
        cur = self.current
        missing = [n for n in names if not cur.has(n)]
        if not missing:
            return cur, [cur.element(n) for n in names]
        log.info("fastt: the graph grew (%s); re-activating on it", missing[0])
        self.backend.activate(cur.strategy)
        cur = self.current
        return cur, [cur.element(n) for n in names]

    def make_callable(self, callable_options: Any) -> "_Callable":
        return _Callable(self, callable_options)

    def call(self, c: "_Callable", args: tuple[Any, ...], run_metadata: Any) -> Any:
        if self.watch is not None:
            self.watch.check()
        ctl = self._controller_for(c.signature, c.names) if not self._off else None
        if ctl is not None:
            ctl.step_started(time.perf_counter())
        trace = ctl.before_step() if ctl else False
        if ctl is not None and self.engine.models is None:
            self.feed_shapes = {n: np.shape(a) for n, a in zip(c.options.feed, args)}
        cur = self.current
        skey, extra = (self.streams.extra(list(c.options.fetch), list(c.options.target),
                                          list(c.options.feed))
                       if cur is self.user else (None, []))
        key = (c, trace, tuple(t.name for t in extra))
        fn = cur.callables.get(key)
        if fn is None:
            if cur is not self.user:
                cur, _ = self._resolve(c.names + list(c.options.feed))
            opts = c.options
            if trace:
                opts = config_pb2.CallableOptions()
                opts.CopyFrom(c.options)
                opts.run_options.trace_level = config_pb2.RunOptions.FULL_TRACE
            bounded = config_pb2.CallableOptions()
            bounded.CopyFrom(opts)
            bounded.run_options.CopyFrom(self._deadline(opts.run_options, cur is not self.user))
            if cur is self.user:
                bounded.fetch.extend(t.name for t in extra)
                fn = hook.original("_make_callable_from_options")(cur.sess, bounded)
            else:
                fn = hook.plain_callable(cur.sess, bounded)
            cur.callables[key] = fn
        meta = _tf1.RunMetadata() if trace else run_metadata
        try:
            with profiler_chatter_dropped() if trace else contextlib.nullcontext():
                out = fn(*args, run_metadata=meta)
        except Exception as e:  # noqa: BLE001 - back to the original graph, then retry once
            if not self._recovered(cur, e):
                raise
            return self.call(c, args, run_metadata)
        if skey is not None:
            self.streams.count(skey, out[len(out) - len(extra):])
            out = out[:len(out) - len(extra)]
        cur.snapshot = None
        if ctl is not None:
            if trace and run_metadata is not None:
                run_metadata.MergeFrom(meta)
            ctl.after_step(meta if trace else None)
        return out

    def partial_run_setup(self, fetches: Any, feeds: Any = None) -> Any:
        if self.current is self.user:
            return hook.original("partial_run_setup")(self.sess, fetches, feeds)
        req = hook.request(self.graph, fetches)
        feed_names = [self.graph.as_graph_element(f, allow_operation=False).name
                      for f in (feeds or [])]
        return self.current.sess.partial_run_setup(req.fetch_names + req.target_names,
                                                   feed_names)

    def partial_run(self, handle: Any, fetches: Any, feed_dict: Any = None) -> Any:
        if self.current is self.user:
            return hook.original("partial_run")(self.sess, handle, fetches, feed_dict)
        req = hook.request(self.graph, fetches, feed_dict)
        values = self.current.sess.partial_run(handle, req.fetch_names + req.target_names,
                                               dict(req.feeds))
        return hook.build_results(self.sess, req, values[:len(req.fetch_names)])

    def close(self) -> None:
        ctl = self.controller if not self._closed else None
        if not self._closed and ctl is None and not self._off and self.finder.total:
            self._decline(self.finder.why_not_found())
        self._closed = True
        _open.discard(self)
        if ctl is not None:
            ctl.close()
            if ctl.history:
                dump.refresh([e.dump for e in ctl.history[:-1]], self.settings.strict)
        if self.current is not self.user:
            self.current.close()
            self.current = self.user

    # -- finding the training step ---------------------------------------------------------
    def _controller_for(self, signature: Any, names: list[str]) -> Controller | None:
        try:
            return self._find_step(signature, names)
        except Exception as e:  # noqa: BLE001 - never break training
            if self.settings.strict:
                raise
            self._decline(f"could not analyse the graph ({type(e).__name__}: {e})",
                          logging.WARNING)
            return None

    def _find_step(self, signature: Any, names: list[str]) -> Controller | None:
        if self.controller is not None:
            if signature != self._step_signature and self.finder.see(signature, names) \
                    and self.finder.runs[signature] == 2:
                log.info("fastt: another training step recurs (%s); fastt plans the first one "
                         "found, this one runs unplanned on the same graph",
                         ", ".join(sorted(signature[1] + signature[0])[:3]))
            return self.controller if signature == self._step_signature else None
        if self._off:
            return None
        if self.finder.see(signature, names):
            return self._start(signature, names)
        if self.finder.total == DECLINE_AFTER_RUNS:
            self._decline(self.finder.why_not_found(), off=False)
        return None

    def _updates_trainables(self, names: list[str]) -> bool:
        trainable = {v.op.name for v in self.graph.get_collection(
            _tf1.GraphKeys.TRAINABLE_VARIABLES)}
        return updates_trainables(self.engine.ir, names, trainable)

    def _decline(self, reason: str, level: int = logging.INFO, off: bool = True) -> None:
        """fastt does not plan this session: say why, once, and record it in the dump
        directory (``off=False``: not yet; a training step found later is still planned)."""
        self._off = self._off or off
        if self._declined:
            return
        log.log(level, "fastt: %s; this session runs as it is%s", reason,
                "" if off else " until a training step recurs")
        self._declined = reason
        if self.settings.dump_dir:
            dumps.write_declined(self.settings.dump_dir, dumps.declined_document(
                self.session, reason, self.finder.total, self.finder.signatures()),
                self.settings.strict)

    def _start(self, signature: Any, names: list[str]) -> Controller | None:
        devices = remote.devices(self.sess, self.settings.devices)
        if len(devices) < 2:
            self._decline("fewer than 2 devices (set FASTT_DEVICES, e.g. cpu:2)")
            return None
        if self._declined:  # said too early: a training step did recur
            dumps.remove_declined(self.settings.dump_dir, self.session)
            self._declined = ""
        self._step_signature = signature
        e = self.engine
        e.devices, e.fetches = devices, [n.split(":")[0] for n in names]
        e.target, e.config = self.target, self.inner_config()
        self.backend = PluginBackend(self, e)
        self.controller = Controller(self.settings, self.backend, session=self.session)
        log.info("fastt: training step found (%d fetches and targets); planning over %d "
                 "devices", len(names), len(devices))
        return self.controller

    def inner_config(self) -> Any:
        cfg = _tf1.ConfigProto()
        if self.config is not None:
            cfg.CopyFrom(self.config)
        if self.settings.logical_cpus > cfg.device_count.get("CPU", 1):
            cfg.device_count["CPU"] = self.settings.logical_cpus
        return remote.on_cluster(cfg) if self.watch is not None else cfg


class _Callable:
    """What ``_make_callable_from_options`` returns (tf-keras runs its steps through it):
    it runs on whichever session currently serves the user's."""

    def __init__(self, plugin: SessionPlugin, options: Any) -> None:
        self.plugin, self.options = plugin, options
        self.names = list(options.fetch) + list(options.target)
        self.signature = (tuple(sorted(options.fetch)), tuple(sorted(options.target)),
                          tuple(sorted(options.feed)))

    def __call__(self, *args: Any, run_metadata: Any = None) -> Any:
        return self.plugin.call(self, args, run_metadata)


def _with(options: Any, **fields: Any) -> Any:
    """A copy of ``options`` (RunOptions, possibly None) with ``fields`` set."""
    opts = _tf1.RunOptions()
    if options is not None:
        opts.CopyFrom(options)
    for k, v in fields.items():
        setattr(opts, k, v)
    return opts
