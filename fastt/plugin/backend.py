"""The ``Controller``'s TensorFlow side for one user session: the engine's pipeline (profile,
plan, predict, rewrite), the inner sessions that run its strategies, and their dumps."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from fastt.adapters.engine import Engine
from fastt.errors import WorkerLostError
from fastt.plugin import activation, dump
from fastt.plugin.activation import Running
from fastt.plugin.entry import Entry
from fastt.plugin.state import unsaved, unserializable
from fastt.plugin.streams import continue_streams, skipped_note
from fastt.sched.strategy import Strategy
from tf_patches import priority_executor
from tf_patches import session_hook as hook

if TYPE_CHECKING:
    from fastt.plugin.runtime import SessionPlugin

log = logging.getLogger("fastt")
_tf1 = tf.compat.v1


class PluginBackend:
    """What the controller asks of TensorFlow, for ``plugin``'s session, through ``engine``."""

    def __init__(self, plugin: "SessionPlugin", engine: Engine) -> None:
        self.plugin, self.engine, self.settings = plugin, engine, plugin.settings
        self._streams_said = False
        self._dump_said = False  # a dump that could not be written was said once
        engine.enforce = self.order_mechanism()  # its predictions replay what will run

    def starting_strategy(self) -> str:
        name, why_not = self.engine.starting_strategy(self.settings.strategy)
        if why_not:
            log.info("fastt: %s; starting from %s", why_not,
                     "a model-parallel spread" if name == "m-topo" else name)
        return name

    def original_misfit(self) -> str:
        return self.engine.original_misfit()

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

    def cost_change(self) -> float:
        return self.engine.cost_change()

    def _probed(self) -> None:
        """The links and device reaches a plan needs, measured once (on a cluster, every
        server checked first: the probes run on each)."""
        if self.engine.unprobed():
            self.plugin.guard.check(force=True)
            with hook.plain_sessions():
                self.engine.probe()

    def plan(self, name: str) -> Strategy:
        self._probed()
        s = self.engine.plan(name, split=self.settings.split,
                             bucket_bytes=self.settings.bucket_mb * 2 ** 20,
                             transfer_priorities=self.settings.transfer_priorities)
        log.info("fastt: planned %s in %.2f s: predicted %.2f ms/step, %d splits", name,
                 s.plan_time_s, 1e3 * s.predicted_step_time_s, len(s.splits))
        return s

    def predict(self, strategy: Strategy, fifo: bool = False) -> float:
        self._probed()
        return self.engine.predict(strategy, fifo=fifo)

    def activate(self, strategy: Strategy | None, ordered: bool = True) -> None:
        """Run ``strategy`` (None: the original graph) in a new inner session holding the
        running one's state; the running one closes. When the original graph cannot be
        started anew, the user's own session takes the state back (``_back_to_user``)."""
        try:
            self._start(strategy, ordered)
        except WorkerLostError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's own session is the last resort
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
        cur = p.current
        state = cur.snapshot if cur.snapshot is not None else cur.capture()
        p.user_state().restore(p.user.run, state, p.iterator_inits.last)
        if say:
            log.warning("fastt: %s; the training state went back into the script's own "
                        "session", why)
        p.current = p.user
        cur.close()

    def _start(self, strategy: Strategy | None, ordered: bool) -> None:
        p = self.plugin
        new = self.build(strategy, ordered)
        old, p.current = p.current, new
        old.close()

    def build(self, strategy: Strategy | None, ordered: bool = True) -> Running:
        """A new inner session running ``strategy`` (None: the original graph), holding the
        running graph's state; the running graph is left as it is."""
        p = self.plugin
        config = p.inner_config()
        mechanism = self.order_mechanism() if ordered and strategy is not None else "none"
        gd, graph = self.engine.rewrite(strategy, mechanism)
        if mechanism == "priority-executor" and not config.experimental.executor_type:
            config.experimental.executor_type = priority_executor.EXECUTOR_TYPE
        if p.current is p.user:  # iterators that cannot move stay in the user's session
            p.inputs.stage(unserializable(p.user_state(), p.user.run))
        kept = unsaved(p.graph)[1] if p.inputs.staged else set()
        gd, counters, left = continue_streams(p.inputs.placeholders(gd), p.graph, kept)
        if left and not self._streams_said:
            self._streams_said = True
            log.warning("fastt: %s", skipped_note(left))
        inits = [op.name for op in p.graph.get_collection(_tf1.GraphKeys.TABLE_INITIALIZERS)]
        p.guard.check(force=True)  # TensorFlow waits for ever on a lost server here
        state = p.user_state()
        new = activation.start(gd, strategy, graph, p.target, config, p.current,
                               state.variables, state.iterators, inits, counters,
                               p.iterator_inits.last)
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

    def record(self, entry: Entry, history: list[Entry]) -> str:
        ctl = self.plugin.controller
        if not self.settings.dump_dir or ctl is None:
            return ""
        try:
            doc = dump.document(entry, history, ctl.original_s,
                                self.order_mechanism() if entry.ordered else "none",
                                ctl.session)
            return dump.write(self.settings.dump_dir, entry, doc, self.engine.models,
                              self.engine.devices, self.engine.step, self.settings.strict)
        except Exception as e:  # noqa: BLE001 - a dump never stops training
            if self.settings.strict:
                raise
            if not self._dump_said:
                self._dump_said = True
                log.warning("fastt: could not write a dump in FASTT_DUMP_DIR=%s (%s: %s); "
                            "training goes on", self.settings.dump_dir, type(e).__name__, e)
            return entry.dump
