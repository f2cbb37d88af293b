"""fastt's pipeline on one TensorFlow graph, as every caller runs it (the session plugin, the
demo, the real testbed):

    tf.Graph -> IR -> observe(RunMetadata) -> cost models -> probe() -> plan / predict
             -> rewrite -> GraphDef (and the graph it runs, for the next profiles)

The engine holds what the pipeline learns about the graph (its IR with measured shapes, the
cost models); the caller owns the sessions that run the graphs it returns (``trace`` runs
steps on one it is given).
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from typing import Any, Mapping, Sequence

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from fastt.adapters.datasets import iterator_batches, iterator_pipelines
from fastt.adapters.probe import probe_devices, unprobed
from fastt.adapters.rewrite import merged_graph, order_edges, rewrite
from fastt.adapters.runner import traced_run
from fastt.adapters.tf_import import from_tf_graph, inferred_shapes
from fastt.costs import CostModels, MemoryModel
from fastt.costs.source import ModelCosts, StaticCosts
from fastt.errors import FasttError, NoBatch
from fastt.ir import Graph, TensorRef
from fastt.passes.batch_shapes import batch_filled
from fastt.op_types import BATCH_SOURCES
from fastt.profiler import Profile, profile
from fastt.sched.sim.problem import Device
from fastt.sched.registry import DEFAULT
from fastt.sched.search.memory_fit import (FITTED, data_parallel_fitting,
                                           peak_memory_one_device)
from fastt.sched.search.step_fitting import fit_step
from fastt.sched.strategy import Strategy, plan, predict, replay

ORDERS = ("priority-executor", "control-dependencies", "none")  # how a plan's order is kept


class Engine:
    """The pipeline for the training step ``fetches`` of ``graph`` on ``devices`` (ops named
    under ``exclude/`` are left out: the plugin's own). ``target`` and ``config`` are where
    the link probes run. ``enforce``: how a plan's order is kept when it runs (``ORDERS``;
    default: control dependencies on a cluster, the priority executor in-process), which its
    predictions replay."""

    def __init__(self, graph: tf.Graph, devices: Sequence[Device], fetches: Sequence[str],
                 *, target: str = "", config: Any = None, exclude: str = "",
                 name: str = "user", enforce: str | None = None) -> None:
        self.graph, self.devices = graph, list(devices)
        self.fetches = [f.split(":")[0] for f in fetches]
        self.target, self.config, self.name = target, config, name
        self.enforce = enforce or ("control-dependencies" if target else "priority-executor")
        if self.enforce not in ORDERS:
            raise FasttError(f"unknown order mechanism {self.enforce!r}; one of "
                             f"{', '.join(ORDERS)}")
        self._as_run: tuple[Strategy, Strategy] | None = None  # (a plan, its graph as run)
        self._exclude = exclude + "/" if exclude else ""
        self.models: CostModels | None = None
        self._ir: Graph | None = None
        self._version = -1
        self._shapes: dict[TensorRef, tuple[int, ...]] = {}
        self._step: tuple[Graph, tuple[str, ...], Graph] | None = None
        self._peak: tuple[Graph, float] | None = None  # (step graph, ``original_peak``)
        self._original: tuple[Graph, Strategy] | None = None  # (step graph, its plan)
        # (plan key, untraced step) of the last traced step calibrated on its own replay: the
        # next traced step of the same profile replaces its record rather than adding one
        self._sampled: tuple[str, float] | None = None

    def keep_devices(self, devices: Sequence[Device]) -> None:
        """Plan over ``devices`` from now on (after others were lost): the cost models stay,
        what was derived from the old device set goes."""
        self.devices = list(devices)
        self._original = self._as_run = self._peak = None

    # -- the graph -------------------------------------------------------------------------
    @property
    def ir(self) -> Graph:
        """The graph in fastt's IR, re-imported when it grew; measured shapes survive."""
        if self._ir is None or self._version != self.graph.version:
            self._version = self.graph.version
            ir = from_tf_graph(self.graph, name=self.name)
            if self._exclude:
                ir = Graph([op for op in ir if not op.name.startswith(self._exclude)],
                           name=ir.name, meta=ir.meta)
            self._ir = ir.with_output_shapes(self._shapes) if self._shapes else ir
        return self._ir

    @property
    def step(self) -> Graph:
        """What the training step runs (found again when the IR or the fetches change)."""
        ir, key = self.ir, tuple(self.fetches)
        if self._step is None or self._step[0] is not ir or self._step[1] != key:
            self._step = (ir, key, ir.fan_in(self.fetches))
        return self._step[2]

    def graph_def(self) -> graph_pb2.GraphDef:
        """The graph as it is (less the excluded ops): what the original runs."""
        gd = self.graph.as_graph_def()
        if self._exclude:
            keep = [n for n in gd.node if not n.name.startswith(self._exclude)]
            if len(keep) != len(gd.node):
                del gd.node[:]
                gd.node.extend(keep)
        return gd

    # -- profiles into cost models ---------------------------------------------------------
    def observe(self, run_metadata: Any, untraced_s: float | None = None,
                graph: Graph | None = None, feed_shapes: Mapping[str, Sequence[int]] = {},
                strategy: Strategy | None = None, fifo: bool = False) -> Profile:
        """One traced step of ``graph`` (default: the original) into the cost models;
        ``untraced_s``: its untraced step time, to remove the tracing overhead. The first one
        also gives the shapes the graph left unknown (``feed_shapes``: those fed).

        With ``strategy`` (what ``graph`` runs; ``fifo``: in TensorFlow's own order) and its
        untraced time, a step over several devices is calibrated on its own replay: what the
        untraced step takes beyond the replay under the updated models is what a step over
        several devices pays beyond its ops and transfers (``CostModels.record_overhead``).
        A traced step over several devices cannot say it itself: tracing stretches its
        kernels' span past the untraced step."""
        p = profile(run_metadata, graph or self.ir, untraced_s,
                    self.models.comm.background if self.models is not None else None)
        if self.models is None:
            fed = {TensorRef.parse(n): tuple(s) for n, s in feed_shapes.items()}
            measured = {**p.output_shapes, **fed}
            ir = self.ir
            inputs = {f"{r.op}:{r.index}": s for r, s in measured.items()
                      if r.op in ir and ir[r.op].type in BATCH_SOURCES}
            # a run reports no shapes for the ops grappler fused away: TensorFlow infers them
            self._shapes = {**inferred_shapes(self.graph_def(), inputs), **measured}
            self._ir = ir.with_output_shapes(self._shapes, p.output_bytes)
            self.models = CostModels(memory=MemoryModel.from_graph(self._ir))
        used = len({s.device for s in p.compute})
        if strategy is None or untraced_s is None or used < 2:
            self.models.update(p)
            return p
        self.models.update(p, timed=False)
        sample = (strategy.key(), untraced_s)
        self.models.record_overhead(self._beyond_replay(strategy, untraced_s, fifo), used,
                                    sample[0], again=sample == self._sampled)
        self._sampled = sample
        return p

    def calibrate(self, strategy: Strategy | None, untraced_s: float, fifo: bool = False
                  ) -> None:
        """``strategy``'s (None: the original's, on the first device) untraced step time, the
        median of a steady sample measured as it runs (``fifo``: in TensorFlow's own order):
        one more record of its own calibration (``CostModels.calibrate``), so that a plan
        that ran is predicted by what it measured. Nothing before a first profile."""
        if self.models is None:
            return
        s = strategy if strategy is not None else self.original_plan()
        sample = (s.key(), untraced_s)
        self.models.calibrate(sample[0], self._beyond_replay(s, untraced_s, fifo),
                              again=sample == self._sampled,
                              devices_used=len(set(s.placement.values())))
        self._sampled = sample

    def original_plan(self) -> Strategy:
        """The original graph as a plan: every op of the step on the first device (where it
        runs)."""
        step = self.step
        if self._original is None or self._original[0] is not step:
            self._original = (step, plan(self.ir, self.devices[:1], self.costs(), "single",
                                         fetches=self.fetches))
        return self._original[1]

    def on_first_device(self) -> Strategy:
        """The original graph as a plan on the first device: ``original_plan`` once a
        profile was observed; before, every op of the step there, its step time not
        predicted (0, and its note says so)."""
        if self.models is not None:
            return self.original_plan()
        s = plan(self.ir, self.devices[:1], StaticCosts({}, _NoLinks()), "single",
                 fetches=self.fetches)
        return dataclasses.replace(s, note="placed before any profile: its step time was not "
                                           "predicted")

    def _beyond_replay(self, strategy: Strategy, untraced_s: float, fifo: bool) -> float:
        """What an untraced step of ``strategy`` (``fifo``: run in TensorFlow's own order)
        took beyond its replay under the current cost models."""
        as_run, in_fifo = self.runs_as(strategy, fifo)
        return untraced_s - replay(as_run, self.devices, self.costs(), self.step,
                                   fifo=in_fifo)[1].makespan

    def trace(self, sess: Any, feed_dict: Any = None, steps: int = 1, warmup: int = 0,
              graph: Graph | None = None, untraced_s: float | None = None,
              strategy: Strategy | None = None, fifo: bool = False) -> list[Profile]:
        """Run the training step in ``sess`` ``warmup`` times untraced, then ``steps`` times
        traced, each observed (``graph``: what ``sess`` runs, default the original;
        ``strategy``, ``fifo``: the plan it runs, see ``observe``)."""
        for _ in range(warmup):
            sess.run(self.fetches, feed_dict=feed_dict)
        return [self.observe(traced_run(sess, self.fetches, feed_dict)[1], untraced_s, graph,
                             strategy=strategy, fifo=fifo)
                for _ in range(steps)]

    def cost_change(self) -> float:
        """How much the compute costs moved with the last profiles (relative)."""
        return self._models().compute.relative_change()

    def unprobed(self) -> bool:
        """Whether some link or device reach is not known yet (``probe`` measures them)."""
        links, reach = unprobed(self._models(), [d.name for d in self.devices])
        return bool(links or reach)

    def probe(self) -> None:
        """Measure the links and device reaches not known yet (runs small graphs on
        ``target``)."""
        probe_devices(self._models(), [d.name for d in self.devices], self.target, self.config)

    def costs(self) -> ModelCosts:
        return ModelCosts(self._models())

    # -- strategies ------------------------------------------------------------------------
    def starting_strategy(self, chosen: str = DEFAULT) -> tuple[str, str]:
        """The first plan to try: data parallel when a replica fits each device; without a
        batch, a model-parallel spread; when a replica does not fit, the ``chosen`` strategy
        (a search finds what fits: a pipeline over micro-batches, a spread); and why not
        data parallel ("" when it is)."""
        try:
            fits = data_parallel_fitting(self.step, self.devices) is not None
        except NoBatch as e:
            return "m-topo", f"no data parallelism ({e})"
        if not fits:
            return chosen, "a data-parallel replica does not fit the devices' memory"
        return "data-parallel", ""

    def assume_fed(self, feed_shapes: Mapping[str, Sequence[int]]) -> None:
        """Before any profile: the step's shapes as TensorFlow infers them from those fed
        (``"op:index" -> shape``) and from the batch its tf.data input yields where the graph
        says it (``iterator_batches``), so that its memory is known before it first runs. A
        profile's measured shapes replace them."""
        if self.models is not None:
            return
        ir, gd = self.ir, self.graph_def()
        read: dict[str, tuple[int, ...]] = {
            f"{name}:{i}": (batch, *(d for d in t.shape[1:] if d is not None))
                for name, batch in iterator_batches(gd).items() if name in ir
                for i, t in enumerate(ir[name].outputs)
                if t.shape and t.shape[0] is None and None not in t.shape[1:]}
        fed = {**read, **{n: tuple(s) for n, s in feed_shapes.items()}}
        if not fed:
            return
        self._shapes = {**inferred_shapes(gd, fed),
                        **{TensorRef.parse(n): s for n, s in fed.items()}}
        ir = ir.with_output_shapes(self._shapes)
        leading = Counter(s[0] for s in fed.values() if len(s) > 1 and s[0] > 1)
        if leading:  # the rest of the batch-carrying shapes inference left unknown
            self._shapes = {**batch_filled(ir, leading.most_common(1)[0][0]), **self._shapes}
            ir = ir.with_output_shapes(self._shapes)
        self._ir = ir

    def variable_bytes(self) -> float:
        """The bytes of the graph's variables (all of them, not only the step's)."""
        return float(sum(MemoryModel.from_graph(self.ir).persistent.values()))

    def input_bytes(self) -> float:
        """The bytes the step's tf.data inputs hold between steps once they run: their
        sources' tensors (``iterator_pipelines``) and a batch in the making (a tutorial MLP's
        ``from_tensor_slices(...).batch(16384)`` held its 32 MiB of arrays and 21 MiB more,
        for batches of 16 MiB)."""
        step = self.step
        return float(sum(p.held_bytes + sum(t.nbytes or 0 for t in step[n].outputs)
                         for n, p in iterator_pipelines(self.graph_def()).items()
                         if n in step))

    def original_peak(self) -> float:
        """The bytes the original step holds at its peak on one device, by fastt's memory
        model (``peak_memory_one_device``), once per step graph."""
        step = self.step
        if self._peak is None or self._peak[0] is not step:
            self._peak = (step, peak_memory_one_device(step))
        return self._peak[1]

    def original_misfit(self) -> str:
        """Why the original graph does not fit its device's memory by fastt's memory model
        ("" when it does, or the memory is not bounded)."""
        limit = self.devices[0].memory
        if limit == math.inf or self.original_peak() <= limit:
            return ""
        return (f"the original graph would hold {self.original_peak() / 2 ** 20:.1f} MiB on "
                f"one device, more than its {limit / 2 ** 20:.1f} MiB")

    def fitted(self, limit: float) -> Strategy:
        """The training step fitted to hold at most ``limit`` bytes on the first device
        (``fit_step``: gradient accumulation, else recomputation; ``DoesNotFit`` saying why
        neither does). Its step time is not known before it is profiled (NaN)."""
        began = time.perf_counter()
        fit = fit_step(self.step, limit)
        d, g = self.devices[0].name, fit.graph
        return Strategy(FITTED, [d], g, {n: d for n in g.names}, g.names, math.nan,
                        math.nan, time.perf_counter() - began, fetches=self.fetches,
                        note=fit.note, recomputed=fit.recomputed,
                        micro_batches=fit.micro_batches)

    def plan(self, name: str, devices: Sequence[Device] | None = None, **options: Any
             ) -> Strategy:
        """Strategy ``name`` for the training step (``devices``: a subset; ``options``: see
        ``fastt.sched.strategy.plan``). Where the priority executor does not keep the whole
        order, an ordered plan is predicted as it will run (``runs_as``), and runs in
        TensorFlow's own order when that is predicted faster."""
        s = plan(self.ir, devices or self.devices, self.costs(), name, fetches=self.fetches,
                 **options)
        if not s.ordered or self.enforce == "priority-executor":
            return s
        # (free links, one transfer at a time) in each order, chosen as the planner chooses:
        # TensorFlow's where its contended replay is faster
        kept, fifo = ((self.predict(s, fifo=f), self.predict(s, fifo=f, link_concurrency=1))
                      for f in (False, True))
        ordered = self.enforce != "none" and not fifo[::-1] < kept[::-1]
        predicted, simulated = kept if ordered else fifo
        return dataclasses.replace(s, predicted_step_time_s=predicted,
                                   simulated_step_time_s=simulated, ordered=ordered)

    def predict(self, strategy: Strategy, fifo: bool = False, **options: Any) -> float:
        """``strategy``'s step time under the current cost models, as it runs (``runs_as``;
        ``fifo``: in TensorFlow's own order; ``options``: see
        ``fastt.sched.strategy.predict``)."""
        s, in_fifo = self.runs_as(strategy, fifo)
        return predict(s, self.devices, self.costs(), self.step, fifo=in_fifo, **options)

    def runs_as(self, strategy: Strategy, fifo: bool = False) -> tuple[Strategy, bool]:
        """``strategy`` as its graph runs, for a replay, and whether it replays first come,
        first served. The priority executor keeps the whole order. Control dependencies keep
        only the edges the rewrite can add (none into a kernel oneDNN may fuse, none where
        the graph orders two ops already): TensorFlow's executor runs each device's ready
        ops first come, first served within them, so the plan replays that way, over its
        graph with those edges."""
        if fifo or self.enforce == "none":
            return strategy, True
        if self.enforce != "control-dependencies":
            return strategy, False
        if self._as_run is None or self._as_run[0] is not strategy:
            edges = order_edges(merged_graph(self.ir, strategy), strategy)
            g = strategy.graph
            extra = {n: g[n].with_(control_inputs=g[n].control_inputs + tuple(c))
                     for n, c in edges.items()}
            self._as_run = (strategy, dataclasses.replace(strategy, graph=g.replace_ops(extra)))
        return self._as_run[1], True

    def rewrite(self, strategy: Strategy | None, order: str = "none"
                ) -> tuple[graph_pb2.GraphDef, Graph]:
        """The GraphDef that runs ``strategy`` (None: the original) with its order kept
        ``order`` way (``ORDERS``), and the graph its profiles are attributed to."""
        if order not in ORDERS:
            raise FasttError(f"unknown order mechanism {order!r}; one of {', '.join(ORDERS)}")
        if strategy is None:
            return self.graph_def(), self.ir
        merged = merged_graph(self.ir, strategy)
        gd = rewrite(self.ir, strategy, enforce_order=order == "control-dependencies",
                     priority=order == "priority-executor", merged=merged)
        return gd, merged

    def _models(self) -> CostModels:
        if self.models is None:
            raise FasttError("no profile observed yet: the cost models are empty")
        return self.models


class _NoLinks:
    def link(self, src: str, dst: str) -> tuple[float, float]:
        return 0.0, 0.0
