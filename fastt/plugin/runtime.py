"""The plugin behind one user ``Session``: serves its runs on whichever session runs the
current strategy, finds the training step (``StepDetector``), and drives its ``Controller``
around each step (whose TensorFlow side is ``fastt.plugin.backend``).

Until a strategy is active every call goes to the user's own session unchanged. Afterwards the
user's fetches and feeds (every form ``Session.run`` takes) are resolved in the user's graph,
named, and run on the inner session, whose graph has the same names; results come back in the
user's structure. ``sess.graph`` stays the user's graph.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import math
import threading
import weakref
from typing import Any, Iterable

import numpy as np
import tensorflow as tf

from fastt.adapters.engine import Engine
from fastt.cluster.health import Returns, Watch
from fastt.ir import Graph
from fastt.plugin import remote, session_dumps, survive
from fastt.plugin.activation import Running
from fastt.plugin.backend import PluginBackend
from fastt.plugin.callables import StepCallable
from fastt.plugin.controller import Controller
from fastt.plugin.elastic import Snapshots
from fastt.plugin.entry import session_id
from fastt.plugin.guard import RETRYABLE, Guard, users_error, with_fields
from fastt.plugin.input_stage import InputStage, fed_name
from fastt.plugin.settings import Settings
from fastt.plugin.state import SCOPE, IteratorInits, RunFanIn, StateOps, stateful_ops
from fastt.plugin.step_finder import StepDetector, updates_trainables
from fastt.plugin.streams import StreamCounter
from fastt.plugin.threads import Background, StepThreads, trace_slot
from fastt.plugin.verify_step import StepCheck
from tf_patches import session_hook as hook
from tf_patches.quiet import profiler_chatter_dropped

log = logging.getLogger("fastt")
_tf1 = tf.compat.v1
_open: "weakref.WeakSet[SessionPlugin]" = weakref.WeakSet()  # closed at exit if still open


@atexit.register
def _close_at_exit() -> None:
    """Sessions a script never closes (tf-keras keeps its own open) still record what they
    tried and say how they ended."""
    for plugin in list(_open):
        with contextlib.suppress(Exception):  # the interpreter is going away
            plugin.close()


class SessionPlugin(survive.Surviving):
    def __init__(self, sess: Any, target: str, config: Any, settings: Settings) -> None:
        self.sess, self.graph, self.target = sess, sess.graph, target
        self.config, self.settings = config, settings
        cluster = settings.cluster
        self.watch = Watch(cluster) if cluster and target == cluster.target else None
        on = settings.elastic == "on" or settings.elastic == "auto" and self.watch is not None
        self.snapshots = Snapshots(settings.replay_mb * 2 ** 20) if on else None
        if self.watch is not None:
            self.watch.forget(remote.started_without())
        self.returns = Returns(self.watch) if on and self.watch is not None else None
        self.user_lost = ""  # why the script's own session can no longer run
        self.guard = Guard(self.watch, self.original_s,
                           self._survive if on and self.watch is not None else None)
        # the pipeline on the user's graph (fastt's own state reads left out); its devices
        # and training step are set once the step is found
        self.engine = Engine(self.graph, [], [], exclude=SCOPE)
        self.detector = StepDetector(settings, session_id(), self._updates_trainables,
                                     self._start, self._misfits)
        self.enforced = math.inf  # bytes TensorFlow lets the step hold, when it would not fit
        self._unfit = ""  # why the step found must be fitted before it runs
        self.backend: PluginBackend | None = None
        self._closed = False
        self.lock = threading.RLock()  # the plugin's state, against runs in other threads
        self.steps = StepThreads()
        self.feed_shapes: dict[str, tuple[int, ...]] = {}  # of the step's first run
        fan_in = RunFanIn(self.graph)  # what each run signature executes, found once
        self.streams = StreamCounter(self.graph, fan_in)
        self.checks = StepCheck(self.graph, self.streams, settings.verify_report)
        self.inputs = InputStage(self.graph, fan_in)
        self.iterator_inits = IteratorInits(self.graph, fan_in)
        self.user = Running(None, self.graph, sess, StateOps(self.graph, *stateful_ops(
            self.graph)), Graph([]), inner=False, streams=self.streams)
        _open.add(self)
        self.current = self.user

    # -- the user's calls ----------------------------------------------------------------
    def run(self, fetches: Any, feed_dict: Any, options: Any, run_metadata: Any) -> Any:
        self.guard.check()
        if self.current is self.user and self.detector.off:
            return self._user_run(fetches, feed_dict, options, run_metadata)
        with self.lock:
            try:
                req = hook.request(self.graph, fetches, feed_dict)
            except Exception:  # noqa: BLE001 - TensorFlow's own run says what is wrong
                if self.current is not self.user:
                    raise
                req = None
            if req is not None and not self.inputs.owns(req.fetch_names + req.target_names):
                self.iterator_inits.see(req.fetch_names, req.target_names, req.feeds)
                self.step_fed(req.feeds.keys(), req.feeds.values())
                ctl = self.step_controller(req.signature, req.fetch_names + req.target_names)
            else:  # TensorFlow's own error to come, or a queue runner's thread
                req = ctl = None
        if req is None:
            return self._user_run(fetches, feed_dict, options, run_metadata)
        if ctl is None:
            return self._dispatch(req, fetches, feed_dict, options, run_metadata)
        try:
            with self.lock:
                ctl.step_started()
                wanted = ctl.before_step()
            with trace_slot(wanted) as trace:
                meta = _tf1.RunMetadata() if trace else run_metadata
                opts = with_fields(options, trace_level=_tf1.RunOptions.FULL_TRACE) \
                    if trace else options
                with profiler_chatter_dropped() if trace else contextlib.nullcontext():
                    out = self._dispatch(req, fetches, feed_dict, opts, meta)
            if trace and run_metadata is not None:
                run_metadata.MergeFrom(meta)
            with self.lock:
                ctl.after_step(meta if trace else None)
        finally:
            self.steps.leave()
        return out

    def step_controller(self, signature: Any, names: list[str]) -> Controller | None:
        """The controller when this run is the training step, which the calling thread
        enters (``steps.leave`` when it ends); None otherwise, and when another thread is
        inside the step too: fastt then steps aside (``_many_threads``). Under ``lock``."""
        ctl = self.detector.controller_for(signature, names)
        if ctl is None:
            return None
        if self._unfit:
            why, self._unfit = self._unfit, ""
            ctl.fit_memory(self.enforced, why)
        if self.steps.enter():
            self.steps.leave()
            self._many_threads()
            return None
        return ctl

    def _many_threads(self) -> None:
        why = ("the training step runs in several threads at once (Hogwild style), and fastt "
               "times and switches graphs one step at a time")
        ctl = self.controller
        if ctl is not None:
            ctl.stop(why)
        if self.current is not self.user:
            assert self.backend is not None  # a graph other than the user's runs
            self.backend.back_to_user(why, say=False)
        self.detector.decline(why)

    def _dispatch(self, req: hook.Request, fetches: Any, feed_dict: Any, options: Any,
                  meta: Any) -> Any:
        with self.lock:
            on_user = self.current is self.user
            if on_user:
                key, shapes = self.streams.extra(req.fetch_names, req.target_names,
                                                 list(req.feeds))
            else:
                reads = self.inputs.reads(req.fetch_names, req.target_names, list(req.feeds))
        if on_user:
            try:
                if not shapes:
                    out = self._user_run(fetches, feed_dict, options, meta, survivable=True)
                else:  # the shapes its random ops drew, fetched with it
                    out, drawn = self._user_run([fetches, shapes], feed_dict, options, meta,
                                                survivable=True)
            except remote.STEP_ERRORS as e:
                with self.lock:
                    if not self.survived(self.user, e):
                        self.guard.failed(e)
                        raise
                return self._dispatch(req, fetches, feed_dict, options, meta)
            with self.lock:
                self.streams.count(key, drawn if shapes else [])
                if self.snapshots is not None:
                    self.snapshots.ran(req.fetch_names, req.target_names, req.feeds)
            return out
        if reads:  # from the queues in the user's session; a retry reuses them
            req.feeds.update(zip([fed_name(t.name) for t in reads], self.user.run(reads)))
        with contextlib.ExitStack() as running:
            with self.lock:
                cur = self.resolve(req.fetch_names + req.target_names + list(req.feeds))
                running.enter_context(cur.in_use())
            first = cur.snapshot is not None
            try:
                values = self.guard.run(lambda: cur.serve(
                    req.fetch_names, req.target_names, req.feeds,
                    self.guard.options(options, first), meta))
                if first and self.settings.verify and cur.strategy is not None:
                    with self.lock:
                        self.verify(cur, req.fetch_names, req.target_names, req.feeds, values)
                if first:
                    cur.snapshot = None
                if self.snapshots is not None:
                    self.snapshots.ran(req.fetch_names, req.target_names, req.feeds)
            except Exception as e:  # noqa: BLE001 - back to the original graph, then retry
                with self.lock:
                    if not (self.survived(cur, e) or self.recovered(cur, e)):
                        raise
                retry = True
            else:
                retry = False
        if retry:
            return self._dispatch(req, fetches, feed_dict, options, meta)
        return hook.build_results(self.sess, req, values)

    def verify(self, cur: Running, fetches: list[str], targets: list[str],
               feeds: dict[str, Any], values: list[Any]) -> None:
        """``FASTT_VERIFY``: the step ``cur`` ran first checked against the original graph
        (``fastt.plugin.verify_step``)."""
        backend = self.backend
        assert backend is not None
        self.checks.check(cur, lambda: backend.build(None), self.controller, fetches, targets,
                          feeds, values)

    def _user_run(self, fetches: Any, feed_dict: Any, options: Any, meta: Any,
                  survivable: bool = False) -> Any:
        """TensorFlow's own run on the user's session (bounded and watched on a cluster;
        ``survivable``: the caller goes on without a lost server where it can, so its error
        is left as TensorFlow raised it)."""
        def run() -> Any:
            return hook.original("run")(self.sess, fetches, feed_dict,
                                        self.guard.options(options, False), meta)
        try:
            return self.guard.run(run)
        except remote.STEP_ERRORS as e:
            if not survivable or self.snapshots is None:
                self.guard.failed(e)
            raise

    def recovered(self, cur: Running, error: Exception) -> bool:
        """After ``error`` on one of fastt's graphs, back to the original graph (state from
        before the failed step); whether to retry the call there. The end of the data,
        cancellations and errors of the script's own code (``users_error``) are the user's,
        not fastt's: they reach the script unchanged and the step is not run again; a lost
        server is an error."""
        self.guard.failed(error)
        ctl = self.controller
        if ctl is None or isinstance(error, RETRYABLE) or \
                users_error(error, self.graph, first=cur.snapshot is not None):
            return False
        if cur.snapshot is not None and ctl.refit(error):
            return True  # fitted anew into less memory: the step runs again there
        ctl.fail(error)
        if self.current is cur:  # fastt's copy of the original graph failed
            assert self.backend is not None  # a graph other than the user's runs
            self.backend.back_to_user("", say=False)
        return self.current is not cur

    def switch(self, new: Running, recovered: bool = False) -> None:
        """``new`` serves the user's runs from now on; the graph that did closes (once the
        runs in progress on it end). The snapshot kept for recovery becomes the state ``new``
        started from, unless it was ``recovered`` from that snapshot and the runs since."""
        old, self.current = self.current, new
        old.close()
        if self.snapshots is not None and not recovered:
            if new.inner and new.snapshot is not None:
                self.snapshots.restart(new.snapshot)
            else:  # the user's own session: fastt holds none of its runs
                self.snapshots.last = None

    def step_fed(self, names: Iterable[str], values: Iterable[Any]) -> None:
        """A run (of the training step, or one that may be) fed ``values`` to ``names``: their
        shapes kept until the engine has modelled the step (its profile is of them), nothing
        done after. Under ``lock``."""
        if self.engine.models is None:
            self.feed_shapes = {n: np.shape(v) for n, v in zip(names, values)}

    @property
    def controller(self) -> Controller | None:
        return self.detector.controller

    def original_s(self) -> float | None:
        """The original graph's median step time, once measured."""
        return self.controller.original_median_s if self.controller else None

    def resolve(self, names: list[str]) -> Running:
        """The running graph, which has every element named ``names``: when the user added
        ops after the activation, fastt first re-activates on the grown graph, so that every
        element comes from the session that will run them."""
        cur = self.current
        missing = [n for n in names if not cur.has(n)]
        if not missing:
            return cur
        log.info("fastt: the graph grew (%s); re-activating on it", missing[0])
        assert self.backend is not None  # a graph other than the user's runs
        self.backend.activate(cur.strategy)
        return self.current

    def user_state(self) -> StateOps:
        """The state of the user's graph as it is now: variables and iterators the script made
        after opening the session (a second model, a metric of a later ``compile``) count;
        the iterators that stay in the user's session (``InputStage.staged``) do not."""
        variables, iterators = stateful_ops(self.graph)
        iterators = [i for i in iterators if i not in self.inputs.staged]
        st = self.user.state
        if variables != st.variables or iterators != st.iterators:
            self.user.state = StateOps(self.graph, variables, iterators)
        return self.user.state

    def make_callable(self, callable_options: Any) -> StepCallable:
        return StepCallable(self, callable_options)

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
        if self._closed:
            return
        self._closed = True
        self.detector.close()
        ctl = self.controller
        _open.discard(self)
        if ctl is not None:
            ctl.close()
            if ctl.history:
                session_dumps.refresh([e.dump for e in ctl.history[:-1]], self.settings.strict)
        if self.current is not self.user:
            if self.watch is not None and self.watch.lost_any:
                # TensorFlow's master can wait out the call's deadline closing a session on
                # a cluster that lost a server (its cleanup of the old sessions): the last
                # graph's session ends with the script, without the call
                hook.forsake(self.target)
            self.current.close()
            self.current = self.user

    # -- finding the training step ---------------------------------------------------------
    def _updates_trainables(self, names: list[str]) -> bool:
        trainable = {v.op.name for v in self.graph.get_collection(
            _tf1.GraphKeys.TRAINABLE_VARIABLES)}
        return updates_trainables(self.engine.ir, names, trainable)

    def _misfits(self, names: list[str]) -> bool:
        """Whether the first run of ``names``, which writes trainable variables, would not
        fit the memory TensorFlow enforces on its device: it would fail as it is, so fastt
        takes it for the training step at once (``enforced``)."""
        limit = remote.misfit_limit(self.sess, self.engine, self.settings, self.feed_shapes,
                                    names)
        if limit < math.inf:
            self.enforced = limit
        return limit < math.inf

    def _start(self, names: list[str]) -> Controller | None:
        """The training step ``names`` was found: its controller, over the session's devices
        (None: fastt declined)."""
        devices, absent = remote.step_devices(self.sess, self.settings,
                                              self.watch.gone if self.watch else set())
        if absent:
            self.detector.decline(absent, logging.WARNING)
            return None
        unfit = self.enforced < math.inf
        if len(devices) < 2 and not unfit:
            self.detector.decline("fewer than 2 devices (set FASTT_DEVICES, e.g. cpu:2)")
            return None
        e = self.engine
        e.devices, e.fetches = devices, [n.split(":")[0] for n in names]
        e.target, e.config = self.target, self.inner_config()
        self.backend = PluginBackend(self, e)
        ctl = Controller(self.settings, self.backend, session=self.detector.session,
                         run_plan=Background)
        if unfit:  # fitted once the detector holds the controller (its dump reads it)
            e.devices = devices[:1]
            self._unfit = (f"the training step would hold {e.original_peak() / 2 ** 20:.1f} "
                           f"MiB on {devices[0].name}, more than the "
                           f"{self.enforced / 2 ** 20:.1f} MiB TensorFlow lets it hold")
            return ctl
        log.info("fastt: training step found (%d fetches and targets); planning over %d "
                 "devices", len(names), len(devices))
        return ctl

    def inner_config(self) -> Any:
        w = self.watch
        # once a server was lost (or left out at the start: the script's session config
        # filters it), the master contacts the servers training runs on, and only those
        return remote.inner_config(self.config, self.settings.logical_cpus, w is not None,
                                   w.tasks if w is not None and w.lost_any else None)
