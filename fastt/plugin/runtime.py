"""The plugin behind one user ``Session``: serves its runs, finds the training step, and is
the ``Controller``'s TensorFlow side (profile, plan, activate, dump).

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

from fastt.adapters.probe import probe_devices, unprobed
from fastt.adapters.rewrite import merged_graph, rewrite
from fastt.adapters.tf_import import from_tf_graph, inferred_shapes
from fastt.cluster.health import Watch
from fastt.costs import CostModels, MemoryModel
from fastt.errors import FasttError
from fastt.ir import Graph, TensorRef
from fastt.inspect import dumps
from fastt.plugin import activation, dump, remote
from fastt.plugin.activation import Running
from fastt.plugin.controller import Controller, session_id, updates_trainables
from fastt.plugin.entry import Entry
from fastt.plugin.input_stage import InputStage, fed_name
from fastt.plugin.settings import Settings
from fastt.plugin.state import SCOPE, IteratorInits, RunFanIn, StateOps, stateful_ops
from fastt.plugin.step_finder import DECLINE_AFTER_RUNS, StepFinder
from fastt.plugin.streams import StreamCounter, continue_streams, skipped_note
from fastt.profiler import profile
from fastt.sched.data_parallel import BATCH_SOURCES, batch_size
from fastt.sched.problem import Device, ModelCosts
from fastt.sched.strategy import data_parallel_fitting, plan, predict
from tf_patches import priority_executor
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
        self.devices: list[Device] = []
        self.step_names: list[str] = []
        self.ir: Graph | None = None
        self.models: CostModels | None = None
        self.finder = StepFinder(self._updates_trainables)
        self.session = session_id()
        self._off = False
        self._declined = ""  # the record written when fastt said it does not plan
        self._closed = False
        self._streams_said = False
        self._ir_version = -1
        self._feed_shapes: dict[str, tuple[int, ...]] = {}
        self._shapes: dict[TensorRef, tuple[int, ...]] = {}
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
        if self.models is None:
            self._feed_shapes = {n: v.shape for n, v in req.feeds.items()}
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
        self.activate(cur.strategy)
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
        if ctl is not None and self.models is None:
            self._feed_shapes = {n: np.shape(a) for n, a in zip(c.options.feed, args)}
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
        return updates_trainables(self._user_ir(), names, trainable)

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

    def _user_ir(self) -> Graph:
        if self.ir is None or self._ir_version != self.graph.version:
            self._ir_version = self.graph.version
            ir = from_tf_graph(self.graph, name="user")
            self.ir = Graph([op for op in ir if not op.name.startswith(SCOPE + "/")],
                            name=ir.name, payload=ir.payload)
            if self._shapes:  # measured shapes survive a re-import
                self.ir = self.ir.with_output_shapes(self._shapes)
        return self.ir

    def _start(self, signature: Any, names: list[str]) -> Controller | None:
        self.devices = remote.devices(self.sess, self.settings.devices)
        if len(self.devices) < 2:
            self._decline("fewer than 2 devices (set FASTT_DEVICES, e.g. cpu:2)")
            return None
        if self._declined:  # said too early: a training step did recur
            dumps.remove_declined(self.settings.dump_dir, self.session)
            self._declined = ""
        self._step_signature = signature
        self.step_names = [n.split(":")[0] for n in names]
        self.controller = Controller(self.settings, self, session=self.session)
        log.info("fastt: training step found (%d fetches and targets); planning over %d "
                 "devices", len(names), len(self.devices))
        return self.controller

    # -- the Controller's backend ------------------------------------------------------------
    def starting_strategy(self) -> str:
        step = self._user_ir().fan_in(self.step_names)
        try:
            batch_size(step)
        except FasttError as e:
            log.info("fastt: no data parallelism (%s); starting from a model-parallel spread", e)
            return "m-topo"
        fits = data_parallel_fitting(step, self.devices) is not None
        return "data-parallel" if fits else "m-topo"

    def profile(self, run_metadata: Any, untraced_s: float | None = None) -> None:
        cur = self.current
        graph = self._user_ir() if cur.strategy is None else cur.profile_graph
        p = profile(run_metadata, graph, untraced_s,
                    self.models.comm.cpu_share if self.models is not None else None)
        if self.models is None:
            fed = {TensorRef(*_split_name(n)): tuple(s) for n, s in self._feed_shapes.items()}
            measured = {**p.output_shapes, **fed}
            user = self._user_ir()
            inputs = {f"{r.op}:{r.index}": s for r, s in measured.items()
                      if r.op in user and user[r.op].type in BATCH_SOURCES}
            # a run reports no shapes for the ops grappler fused away: TensorFlow infers them
            self._shapes = {**inferred_shapes(activation.user_graph_def(self.graph), inputs),
                            **measured}
            self.ir = user.with_output_shapes(self._shapes, p.output_bytes)
            self.models = CostModels(memory=MemoryModel.from_graph(self.ir))
        self.models.update(p)

    def cost_change(self) -> float:
        assert self.models is not None
        return self.models.compute.relative_change()

    def _costs(self) -> ModelCosts:
        assert self.models is not None
        names = [d.name for d in self.devices]
        links, reach = unprobed(self.models, names)
        if links or reach:
            if self.watch is not None:
                self.watch.check(force=True)  # the probes run on every device
            with hook.plain_sessions():
                probe_devices(self.models, names, self.target, self.inner_config())
        return ModelCosts(self.models)

    def plan(self, name: str) -> Any:
        s = plan(self._user_ir(), self.devices, self._costs(), name, fetches=self.step_names,
                 split=self.settings.split)
        log.info("fastt: planned %s in %.2f s: predicted %.2f ms/step, %d splits", name,
                 s.plan_time_s, 1e3 * s.predicted_step_time_s, len(s.splits))
        return s

    def predict(self, strategy: Any, fifo: bool = False) -> float:
        return predict(strategy, self.devices, self._costs(),
                       self._user_ir().fan_in(self.step_names), fifo=fifo)

    def activate(self, strategy: Any | None, ordered: bool = True) -> None:
        ir = self._user_ir()
        config = self.inner_config()
        if strategy is None:
            gd, graph = activation.user_graph_def(self.graph), ir
        else:
            mechanism = self.order_mechanism() if ordered else "none"
            gd = rewrite(ir, strategy, enforce_order=mechanism == "control-dependencies",
                         priority=mechanism == "priority-executor")
            if mechanism == "priority-executor" and not config.experimental.executor_type:
                config.experimental.executor_type = priority_executor.EXECUTOR_TYPE
            graph = merged_graph(ir, strategy)
        gd, counters, left = continue_streams(self.inputs.placeholders(gd), self.graph)
        if left and not self._streams_said:
            self._streams_said = True
            log.warning("fastt: %s", skipped_note(left))
        inits = [op.name for op in self.graph.get_collection(_tf1.GraphKeys.TABLE_INITIALIZERS)]
        if self.watch is not None:  # TensorFlow waits for ever on a lost server here
            self.watch.check(force=True)
        new = activation.start(gd, strategy, graph, self.target, config,
                               self.current, self.user.state.variables,
                               self.user.state.iterators, inits, counters,
                               self.iterator_inits.last)
        old, self.current = self.current, new
        old.close()

    def order_mechanism(self) -> str:
        """How a strategy's op order is enforced: fastt's priority executor in this process
        (when it was built), control dependencies on a cluster (TensorFlow's workers ignore
        executor plugins) or without it, or not at all (``FASTT_ORDER=0``)."""
        if not self.settings.order:
            return "none"
        if not self.target and priority_executor.load():
            return "priority-executor"
        return "control-dependencies"

    def inner_config(self) -> Any:
        cfg = _tf1.ConfigProto()
        if self.config is not None:
            cfg.CopyFrom(self.config)
        if self.settings.logical_cpus > cfg.device_count.get("CPU", 1):
            cfg.device_count["CPU"] = self.settings.logical_cpus
        return remote.on_cluster(cfg) if self.watch is not None else cfg

    def record(self, entry: Entry, history: list[Entry]) -> str:
        if not self.settings.dump_dir:
            return ""
        assert self.controller is not None
        doc = dump.document(entry, history, self.controller.original_s,
                            self.order_mechanism() if entry.ordered else "none",
                            self.controller.session)
        return dump.write(self.settings.dump_dir, entry, doc, self.models, self.devices,
                          self._user_ir().fan_in(self.step_names), self.settings.strict)


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


def _split_name(name: str) -> tuple[str, int]:
    op, _, index = name.rpartition(":")
    return op, int(index)
