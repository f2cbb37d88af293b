"""The ``Controller``'s TensorFlow side for one user session: the engine's pipeline (profile,
plan, predict, rewrite), the inner sessions that run its strategies, and their dumps."""
from __future__ import annotations

import logging
import os
import sys
from typing import Any, Protocol

import tensorflow as tf

from fastt._version import __version__
from fastt.adapters.engine import Engine
from fastt.adapters.fingerprint import graph_digest
from fastt.adapters.rewrite import keep_fit
from fastt.cluster.health import Watch
from fastt.cluster.spec import on_tasks
from fastt.errors import WorkerLostError
from fastt.plugin import activation, budget, cache, remote, session_dumps
from fastt.plugin import messages as say
from fastt.plugin.activation import Running
from fastt.plugin.controller import Controller
from fastt.plugin.entry import Entry
from fastt.plugin.guard import Guard
from fastt.plugin.input_stage import InputStage
from fastt.plugin.recovery import Recovered
from fastt.plugin.settings import Settings
from fastt.plugin.elastic import Snapshots
from fastt.plugin.state import IteratorInits, State, StateOps, unsaved, unserializable
from fastt.plugin.streams import continue_streams, skipped_note
from fastt.sched import serial
from fastt.sched.sim.problem import Device
from fastt.sched.strategy import Strategy
from tf_patches import priority_executor
from tf_patches import session_hook as hook

log = logging.getLogger("fastt")
_tf1 = tf.compat.v1
# the share of a device's enforced memory a fitted step is planned to hold at most: the memory
# model's worst error over its fidelity cases is about a fifth, mostly over
FIT_MARGIN = 0.9


def script() -> str:
    """The script this process runs, as the plan cache names it."""
    return os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c") else \
        "<interactive>"


class Host(Protocol):
    """What the backend reads of the session plugin it serves (``SessionPlugin``); the
    running graph changes only through ``switch``."""
    settings: Settings
    target: str
    graph: tf.Graph  # the user's
    guard: Guard
    inputs: InputStage
    iterator_inits: IteratorInits
    user: Running  # the user's own session
    current: Running  # the graph that serves the user's runs
    feed_shapes: dict[str, tuple[int, ...]]
    snapshots: Snapshots | None  # kept for recovery from a lost device
    watch: Watch | None  # the cluster's servers (None: not on fastt's cluster)
    user_lost: str  # why the script's own session can no longer run ("": it can)

    @property
    def controller(self) -> Controller | None: ...
    def user_state(self) -> StateOps: ...
    def inner_config(self) -> Any: ...
    def switch(self, new: Running, recovered: bool = False) -> None: ...
    def lose_servers(self, loss: Any) -> None: ...
    def survived(self, cur: Any, error: Exception | None) -> bool | None: ...
    def readmit(self) -> list[Any]: ...
    def devices_of(self, tasks: list[Any]) -> list[Device]: ...


class PluginBackend:
    """What the controller asks of TensorFlow, for ``plugin``'s session, through ``engine``."""

    def __init__(self, plugin: Host, engine: Engine) -> None:
        self.plugin, self.engine, self.settings = plugin, engine, plugin.settings
        self._streams_said = False
        self._dump_said = False  # a dump that could not be written was said once
        self._cache = cache.PlanCache(self.settings.cache_dir) if self.settings.cache_dir \
            else None
        engine.enforce = self.order_mechanism()  # its predictions replay what will run
        self._gone: list[Device] = []  # devices lost, which earlier strategies' dumps name
        self._planned_over = list(engine.devices)  # at first, in their order

    def starting_strategy(self) -> str:
        name, why_not = self.engine.starting_strategy(self.settings.strategy)
        if why_not:
            log.info("fastt: %s; starting from %s", why_not,
                     "a model-parallel spread" if name == "m-topo" else name)
        return name

    def original_misfit(self) -> str:
        return self.engine.original_misfit()

    def fit_budget(self, limit: float) -> float:
        """The bytes a step fitted into ``limit`` bytes, the memory TensorFlow enforces on its
        device, may hold itself: a share for the memory model's error (``FIT_MARGIN``) kept
        back, and what the device holds already (``remote.held``)."""
        return FIT_MARGIN * limit - remote.held(self.engine)

    def fitted(self, budget: float) -> Strategy:
        """The training step fitted to hold at most ``budget`` bytes (``Engine.fitted``)."""
        return self.engine.fitted(budget)

    def profile(self, run_metadata: Any, untraced_s: float | None = None) -> None:
        cur = self.plugin.current
        self.engine.observe(run_metadata, untraced_s,
                            cur.profile_graph if cur.strategy is not None else None,
                            self.plugin.feed_shapes, cur.strategy, cur.fifo)

    def calibrate(self, strategy: Strategy | None, ordered: bool, untraced_s: float) -> None:
        """A graph's measured step (``strategy`` None: the original): one more record of its
        plan's calibration."""
        fifo = strategy is None or not ordered or self.order_mechanism() == "none"
        self.engine.calibrate(strategy, untraced_s, fifo)

    def lost(self, error: BaseException) -> None:
        """After fastt's own work failed with ``error``: on the cluster, a
        ``WorkerLostError`` naming each server that does not answer."""
        self.plugin.guard.failed(error)

    def survive(self, error: Exception) -> bool:
        """After fastt's own work failed with ``error`` (a graph to try being started, links
        probed): whether a lost device or server explains it and training went on without
        it, from the last snapshot (recovery on: ``Surviving.survived``)."""
        p = self.plugin
        return bool(p.survived(p.current, error))

    def cost_change(self) -> float:
        return self.engine.cost_change()

    def _probed(self) -> None:
        """The links and device reaches a plan needs, measured once (on a cluster, every
        server checked first: the probes run on each)."""
        if self.engine.unprobed():
            self.plugin.guard.check(force=True)
            with hook.plain_sessions(), self.plugin.guard.running():
                self.engine.probe()

    def prepare_plan(self) -> None:
        """What planning needs from TensorFlow, on the training thread before the plan is
        computed (off it): the links, probed while no step runs."""
        self._probed()
        self.engine.step  # the IR of the graph as it is, read from TensorFlow here

    def plan(self, name: str) -> Strategy:
        self._probed()
        s = self.engine.plan(name, split=self.settings.split,
                             bucket_bytes=self.settings.bucket_mb * 2 ** 20,
                             transfer_priorities=self.settings.transfer_priorities)
        fitted = ""
        if s.micro_batches > 1:
            fitted += f", each replica's share as {s.micro_batches} micro-batches in turn"
        if s.recomputed > 0:
            fitted += f", {s.recomputed} forward ops recomputed in the backward pass"
        if fitted:
            fitted += " (to fit the devices' memory)"
        log.info("fastt: planned %s over %d devices in %.2f s: predicted %.2f ms/step, %d "
                 "splits%s", name, len(self.engine.devices), s.plan_time_s,
                 1e3 * s.predicted_step_time_s, len(s.splits), fitted)
        return s

    def predict(self, strategy: Strategy, fifo: bool = False) -> float:
        self._probed()
        return self.engine.predict(strategy, fifo=fifo)

    def predict_original(self) -> float:
        """The original graph's step time under the current cost models, run in
        TensorFlow's own order as the user's session runs it."""
        self._probed()
        return self.engine.predict(self.engine.original_plan(), fifo=True)

    def activate(self, strategy: Strategy | None, ordered: bool = True) -> None:
        """Run ``strategy`` (None: the original graph) in a new inner session holding the
        running one's state; the running one closes. When the original graph cannot be
        started anew, the user's own session takes the state back (``back_to_user``)."""
        try:
            self._start(strategy, ordered)
        except (WorkerLostError, Recovered):
            raise
        except Exception as e:  # noqa: BLE001 - the user's own session is the last resort
            if self.survive(e):  # a lost server: training goes on without it
                raise Recovered from e
            if strategy is None and self.plugin.current is not self.plugin.user:
                self.back_to_user(f"could not start the original graph anew "
                                  f"({type(e).__name__}: {e})")
            else:
                raise

    def back_to_user(self, why: str, say: bool = True) -> None:
        """The running graph's state into the user's own session, which serves the runs from
        now on (its seeded random ops go on from where they were when fastt first
        activated); ``why`` is said (unless ``say`` is off: said already)."""
        p = self.plugin
        if p.user_lost:
            raise WorkerLostError(f"{why or 'fastt stepped aside'}, and {p.user_lost}")
        cur = p.current
        state = cur.snapshot if cur.snapshot is not None else cur.capture()
        p.user_state().restore(p.user.run, state, p.iterator_inits.last)
        if say:
            log.warning("fastt: %s; the training state went back into the script's own "
                        "session", why)
        p.switch(p.user)
        if p.snapshots is not None:
            p.snapshots.restart(state)

    def step_ended(self) -> float:
        """A training step ended: a snapshot for recovery when one is due
        (``fastt.plugin.elastic``); the seconds it took."""
        p = self.plugin
        snaps = p.snapshots
        if snaps is None:
            return 0.0
        snaps.step_ended()
        if not snaps.due():
            return 0.0
        if p.current is p.user:
            p.user_state()  # variables and iterators made since count
        snaps.take(p.current.capture)
        return snaps.capture_s or 0.0

    def forget_devices(self, lost: list[str]) -> None:
        """Plan over the devices left after ``lost`` (the dumps of strategies planned over
        them still name them)."""
        e = self.engine
        self._gone += [d for d in e.devices if d.name in lost]
        e.keep_devices([d for d in e.devices if d.name not in lost])
        e.target, e.config = self.plugin.target, self.plugin.inner_config()

    def returned(self) -> bool:
        """Whether devices lost before are back (their servers answer again): planned over
        from the next plan on, in their first order."""
        back = self.plugin.readmit()
        devices = [d for d in self._gone if on_tasks(d.name, back)]
        new = [t for t in back if not any(t.holds(d.name) for d in devices)]  # never seen
        if new:
            self._planned_over += self.plugin.devices_of(new)
            devices += [d for d in self._planned_over if on_tasks(d.name, new)]
        if not devices:
            return False
        e = self.engine
        self._gone = [d for d in self._gone if d not in devices]
        kept = {d.name for d in e.devices + devices}
        e.keep_devices([d for d in self._planned_over if d.name in kept])
        e.target, e.config = self.plugin.target, self.plugin.inner_config()
        return True

    def _start(self, strategy: Strategy | None, ordered: bool) -> None:
        self.plugin.switch(self.build(strategy, ordered))

    def build(self, strategy: Strategy | None, ordered: bool = True,
              state: State | None = None) -> Running:
        """A new inner session running ``strategy`` (None: the original graph), holding the
        running graph's state (or ``state``); the running graph is left as it is."""
        p = self.plugin
        config = p.inner_config()
        mechanism = self.order_mechanism() if ordered and strategy is not None else "none"
        gd, graph = self.engine.rewrite(strategy, mechanism)
        if keep_fit(config, strategy):
            log.debug("fastt: the plan fitted to memory runs without grappler")
        if mechanism == "priority-executor" and not config.experimental.executor_type:
            config.experimental.executor_type = priority_executor.EXECUTOR_TYPE
        if p.current is p.user and state is None:  # iterators that cannot move stay in the
            # user's session (a recovery from it has none: ``survive.recover``)
            p.inputs.stage(unserializable(p.user_state(), p.user.run))
        kept = unsaved(p.graph)[1] if p.inputs.staged else set()
        gd, counters, left = continue_streams(p.inputs.placeholders(gd), p.graph, kept)
        if left and not self._streams_said:
            self._streams_said = True
            log.warning("fastt: %s", skipped_note(left))
        inits = [op.name for op in p.graph.get_collection(_tf1.GraphKeys.TABLE_INITIALIZERS)]
        running = p.current
        p.guard.check(force=True)  # TensorFlow waits for ever on a lost server here
        if p.current is not running and state is None:  # recovered from a lost server:
            raise Recovered  # this graph was planned over it
        ops = p.user_state()
        # as a step: given up once a server it needs is found lost, not at the call deadline
        new = p.guard.run(lambda: activation.start(
            gd, strategy, graph, p.target, config, p.current, ops.variables, ops.iterators,
            inits, counters, p.iterator_inits.last, state))
        new.fifo = mechanism == "none"
        return new

    def order_mechanism(self) -> str:
        """How a strategy's op order is enforced: fastt's priority executor in this process
        (when it was built), control dependencies on a cluster (TensorFlow's workers ignore
        executor plugins) or without it, or not at all (``FASTT_ORDER=0``)."""
        if not self.settings.order:
            return "none"
        if not self.plugin.target and priority_executor.load():
            return "priority-executor"
        return "control-dependencies"

    # -- the plan cache ------------------------------------------------------------------
    def cache_parts(self) -> dict[str, str]:
        """What keys this run's plans in the plan cache (``fastt.plugin.cache.PARTS``)."""
        e, s = self.engine, self.settings
        return {
            "graph": cache.digest([graph_digest(e.graph_def()), sorted(e.fetches)]),
            "feeds": cache.digest(sorted((n, list(v)) for n, v in
                                         self.plugin.feed_shapes.items())),
            "devices": cache.digest([[d.name, str(d.memory)] for d in e.devices]),
            "settings": cache.digest([s.strategy, s.split, s.order, s.bucket_mb,
                                      s.transfer_priorities, self.order_mechanism()]),
            "versions": cache.digest([__version__, tf.__version__])}

    def cached(self) -> tuple[Strategy | None, dict[str, float]] | None:
        """The plan an earlier run of this training step on these devices kept (None in it:
        that run kept the original graph), and the costs it saw (None: no entry, or the cache
        is off)."""
        c = self._cache
        if c is None:
            return None
        try:
            hit, why = c.lookup(self.cache_parts(), script())
            if hit is None:
                if why:
                    log.info("fastt: plan cache: %s; planning from the start", why)
                return None
            doc = hit.doc["strategy"]
            strategy = serial.from_document(doc) if doc is not None else None
            costs = {k: float(v) for k, v in hit.doc.get("costs", {}).items()
                     if k in budget.PRIORS}
        except Exception as e:  # noqa: BLE001 - a cache never stops training
            self._cache_failed("read", e)
            return None
        if strategy is None:
            log.info("fastt: plan cache: an earlier run of this training step on these devices "
                     "measured no plan faster than the original graph (%s); fastt tries none "
                     "this time ('fastt cache clear' or FASTT_CACHE=0 to plan again)", hit.key)
            return None, costs
        log.info("fastt: plan cache: %s (%s) was kept by an earlier run of this training step "
                 "on these devices, %.2fx over the original there; checking it against the "
                 "original graph", hit.doc.get("strategy_name", strategy.name), hit.key,
                 hit.doc.get("speedup") or float("nan"))
        return strategy, costs

    def store(self, entry: Entry | None, costs: dict[str, float]) -> None:
        """``entry``, the strategy kept, into the plan cache for the next run (None: no plan
        measured faster than the original graph)."""
        c = self._cache
        if c is None:
            return
        try:
            parts = self.cache_parts()
            ctl = self.plugin.controller
            original = ctl.original_median_s if ctl is not None else None
            mine = entry.measured_median_s if entry is not None else original
            path = c.store(parts, script(), {
                "strategy": serial.to_document(entry.strategy) if entry else None,
                "costs": costs, "strategy_name": entry.name if entry else "original",
                "ordered": entry.ordered if entry else True,
                "devices": [d.name for d in self.engine.devices],
                "step_s": mine, "original_step_s": original,
                "speedup": original / mine if original and mine else None})
            log.debug("fastt: plan cache: %s stored in %s", say.label(entry), path)
        except Exception as e:  # noqa: BLE001 - a cache never stops training
            self._cache_failed("write", e)

    def _cache_failed(self, verb: str, error: Exception) -> None:
        if self.settings.strict:
            raise error
        log.warning("fastt: could not %s the plan cache in FASTT_CACHE_DIR=%s (%s); it is off "
                    "for this session", verb, self.settings.cache_dir, say.failure(error))
        self._cache = None

    def record(self, entry: Entry, history: list[Entry]) -> str:
        ctl = self.plugin.controller
        if not self.settings.dump_dir or ctl is None:
            return ""
        try:
            doc = session_dumps.document(entry, history, ctl.original_s,
                                         self.order_mechanism(), ctl.session)
            doc["overhead"] = ctl.budget.as_dict()
            doc["from_plan_cache"] = entry.cached
            doc["decided_at_step"] = entry.decided_at
            if entry.error:
                doc["error"] = entry.error
            known = {d.name: d for d in self.engine.devices + self._gone}
            planned = getattr(entry.strategy, "devices", None) or []
            devices = [known[n] for n in planned] if all(n in known for n in planned) and \
                planned else self.engine.devices
            return session_dumps.write(self.settings.dump_dir, entry, doc, self.engine.models,
                                       devices, self.engine.step, self.settings.strict)
        except Exception as e:  # noqa: BLE001 - a dump never stops training
            if self.settings.strict:
                raise
            if not self._dump_said:
                self._dump_said = True
                log.warning("fastt: could not write a dump in FASTT_DUMP_DIR=%s (%s: %s); "
                            "training goes on", self.settings.dump_dir, type(e).__name__, e)
            return entry.dump
