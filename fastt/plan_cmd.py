"""``fastt plan``: compute a strategy for a training graph and compare it with the baselines."""
from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from fastt import devices as devnames
from fastt.aside import Aside
from fastt.costs import CostModels
from fastt.costs.source import CostSource, ModelCosts, StaticCosts
from fastt.errors import FasttError, GraphFormatError
from fastt.jsonio import read_bytes, writing
from fastt.ir import Graph
from fastt.sched.sim.device_spec import DeviceSet, parse
from fastt.passes.allreduce import BUCKET_BYTES
from fastt.sched.placers._gc import without_gc
from fastt.sched.registry import DEFAULT, kind, names
from fastt.sched.search.planning import Planning
from fastt.sched.strategy import Strategy, place_first, plan

log = logging.getLogger("fastt")


def check_graph(graph_path: str | None, model: str | None, batch_size: int | None) -> None:
    """What ``load`` will load, checked before TensorFlow is imported: a graph file that can
    be read or a model, not both; a batch size only for a model, and at least 1."""
    if graph_path and model:
        raise FasttError(f"give a graph file or --model, not both (graph file {graph_path!r}, "
                         f"--model {model!r})")
    if not graph_path and not model:
        raise FasttError("give a graph file or --model NAME")
    if batch_size is not None and not model:
        raise FasttError(f"--batch-size {batch_size}: a graph file has its own batch size "
                         "(--batch-size is for --model)")
    if batch_size is not None and batch_size < 1:
        raise FasttError(f"--batch-size {batch_size}: expected a whole number >= 1")
    if graph_path:
        read_bytes(graph_path, "graph file", GraphFormatError, limit=1)


def load(graph_path: str | None, model: str | None, batch_size: int | None) -> Graph:
    """The IR of a graph file, or of a zoo model built on the spot."""
    check_graph(graph_path, model, batch_size)
    import tensorflow as tf

    from fastt.adapters import tf_import
    if graph_path:
        return tf_import.load_graph(graph_path)
    assert model is not None
    from fastt import zoo
    tf.compat.v1.disable_eager_execution()
    built = zoo.build(model, **({"batch_size": batch_size} if batch_size is not None else {}))
    g = tf_import.from_tf_graph(built.graph, name=model)
    g.meta = replace(g.meta, collections={"train_op": [built.train_op.name]})
    return g


def fetches(graph: Graph, explicit: Sequence[str] = ()) -> list[str]:
    """What a training step runs: --fetch, else the MetaGraphDef's train_op collection."""
    if explicit:
        missing = [f for f in explicit if f.split(":")[0] not in graph]
        if missing:
            raise FasttError(f"--fetch names ops that are not in the graph: {missing}")
        return list(explicit)
    train = graph.meta.collections.get("train_op")
    if train:
        return list(train)
    raise FasttError("the graph names no train op: pass --fetch OP (e.g. the optimizer's "
                     "minimize op), or save a MetaGraphDef with a train_op collection")


STATIC = ("calibrated", "analytical")  # --costs computed from the graph, not read


def read_costs(costs: str) -> CostModels | None:
    """``--costs``: None for ``calibrated`` and ``analytical`` (computed once the graph is
    loaded), else the cost models of the file."""
    return None if costs in STATIC else CostModels.load(costs)


def static_seconds(graph: Graph, fetch: Sequence[str], kind: str, calibrated: bool = True
                   ) -> dict[str, float]:
    """Each op's seconds on a device of ``kind`` by TensorFlow's analytical estimator, times
    its class's factor fitted to published measurements (``fastt.costs.calibration``) when
    ``calibrated`` and the kind has factors (else as estimated, said once)."""
    return static_seconds_aside(graph, fetch, kind, calibrated, second_core=False)()


def static_seconds_aside(graph: Graph, fetch: Sequence[str], kind: str,
                         calibrated: bool = True, second_core: bool = True
                         ) -> Callable[[], dict[str, float]]:
    """``static_seconds``, begun on a second core (``fastt.aside``) while this one goes on
    with what needs no costs (the data-parallel graphs): the function returned waits for
    them."""
    from fastt.adapters.export import to_graph_def
    from tf_patches.grappler_costs import analytical_costs
    kind = kind if kind != "GPU" else "V100"

    def estimated() -> dict[str, float]:
        return analytical_costs(to_graph_def(graph), list(fetch), kind)
    job = Aside(estimated) if second_core else None
    return lambda: _calibrated(graph, job.result() if job else estimated(), kind, calibrated)


def _calibrated(graph: Graph, seconds: dict[str, float], kind: str, calibrated: bool
                ) -> dict[str, float]:
    from fastt.costs import calibration
    if not calibrated:
        return seconds
    f = calibration.factors(kind)
    if f is None:
        log.info("no calibration for %s devices: their analytical costs are used as "
                 "estimated", kind)
        return seconds
    return calibration.scaled(graph, seconds, f)


def cost_source(graph: Graph, device_set: DeviceSet, costs: str | CostModels,
                fetch: Sequence[str]) -> CostSource:
    """``costs``: ``calibrated``, ``analytical`` (computed on a second core while planning
    begins), a cost-model file, or cost models read already."""
    if isinstance(costs, CostModels):
        return ModelCosts(costs)
    if costs in STATIC:
        return StaticCosts(static_seconds_aside(graph, fetch, device_set.kind,
                                                costs == "calibrated"), device_set)
    return ModelCosts(CostModels.load(costs))


@dataclass
class Setup:
    """What every strategy of one ``fastt plan`` or ``fastt compare`` is planned against."""
    graph: Graph
    spec: str
    devices: DeviceSet
    fetches: list[str]
    costs: CostSource
    bucket_bytes: float = BUCKET_BYTES
    transfer_priorities: str = "auto"
    deadline: float | None = None  # when (``clock()``) planning should be done
    _planning: Planning | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def planning(self) -> Planning:
        """What its strategies share (the data-parallel graphs, compiled problems,
        placements), built as they need it."""
        if self._planning is None:
            devs = self.devices
            self._planning = Planning(self.graph, devs.devices, self.costs,
                                      devs.copy_bytes_per_s, self.fetches, self.bucket_bytes,
                                      self.transfer_priorities, self.deadline)
        return self._planning

    @property
    def models(self) -> CostModels | None:
        """The cost models, when the costs come from a file fastt wrote."""
        return getattr(self.costs, "models", None)


def prepare(graph: Graph, spec: str, costs: str | CostModels = "calibrated",
            fetch: Sequence[str] = (), bucket_mb: float = BUCKET_BYTES / 2 ** 20,
            transfer_priorities: str = "auto", deadline: float | None = None,
            device_set: DeviceSet | None = None) -> Setup:
    """What ``fastt plan`` plans against; ``deadline`` (``clock()``): when the searches
    should be done (None: each takes its own budget); ``device_set``: ``spec`` parsed
    already."""
    if not bucket_mb >= 0:  # 0: each gradient reduced on its own
        raise FasttError(f"bucket size {bucket_mb} MB: expected a number >= 0")
    device_set = device_set or parse(spec)
    step = fetches(graph, fetch)
    return Setup(graph, spec, device_set, step, cost_source(graph, device_set, costs, step),
                 bucket_mb * 2 ** 20, transfer_priorities, deadline)


@without_gc  # one collection for the command, not one per strategy
def plan_all(setup: Setup, strategy: str = DEFAULT, baselines: Sequence[str] | None = None,
             progress: Any = None, stage: Any = None
             ) -> tuple[Strategy, dict[str, Strategy | str]]:
    """The chosen strategy and every baseline (or why it could not be computed). What
    every plan needs comes first (the baselines without a search or a time limit, whose
    placements OS-DPOS starts from), so that under a deadline the searches (the chosen
    strategy's, the exact program's) share what is left of it, not what is left before it.
    ``progress(name)`` is called before each strategy, ``stage(what)`` before the steps
    between them."""
    others = [b for b in (names() if baselines is None else baselines) if b != strategy]
    first = [b for b in others if not (kind(b).search or kind(b).timed)]
    if setup.planning.deadline is not None:
        if stage:
            n = len(setup.devices.devices)
            stage(f"placing and replaying {len(first)} baselines over {n} "
                  f"device{'s' * (n != 1)}")
        # all placed and replayed before any is finished: a plan that cannot beat the
        # fastest then leaves its transfers unordered (``Planning.may_win``)
        place_first(setup.planning, [kind(b) for b in first])
    out = plan_each(setup, first, progress)
    if progress:
        progress(strategy + (" (its search)" if kind(strategy).search else ""))
    chosen = plan_one(setup, strategy)
    out.update(plan_each(setup, [b for b in others if b not in first], progress))
    return chosen, {b: out[b] for b in others}


def plan_one(setup: Setup, name: str) -> Strategy:
    """Strategy ``name`` for ``setup``; OS-DPOS's split search on every core."""
    return plan(setup.graph, setup.devices.devices, setup.costs, name,
                workers=(os.cpu_count() or 1) if kind(name).search else 1,
                shared=setup.planning)


@without_gc
def plan_each(setup: Setup, names: Sequence[str], progress: Any = None
              ) -> dict[str, Strategy | str]:
    """Each strategy of ``names`` (``plan_one``), or why it could not be computed."""
    out: dict[str, Strategy | str] = {}
    for name in names:
        if progress:
            progress(name)
        try:
            out[name] = plan_one(setup, name)
        except FasttError as e:
            out[name] = str(e)
    return out


def run(graph: Graph, spec: str, strategy: str = DEFAULT, costs: str = "calibrated",
        fetch: Sequence[str] = (), baselines: Sequence[str] | None = None,
        progress: Any = None) -> tuple[Strategy, dict[str, Strategy | str]]:
    """The chosen strategy and every baseline (or why it could not be computed)."""
    return plan_all(prepare(graph, spec, costs, fetch), strategy, baselines, progress)


# Table columns: (header, width, cell of a strategy given the data-parallel step time).
Column = tuple[str, int, Callable[[Strategy, float | None], str]]
COLUMNS: list[Column] = [
    ("predicted step", 16, lambda s, _: f"{s.predicted_step_time_s * 1e3:.3f} ms"),
    ("with link contention", 22, lambda s, _: f"{s.simulated_step_time_s * 1e3:.3f} ms"),
    ("plan time", 12, lambda s, _: f"{s.plan_time_s:.2f} s"),
    ("vs data-parallel", 18,
     lambda s, dp: f"{dp / s.predicted_step_time_s:.2f}x" if dp else "n/a"),
]
WIDE: list[Column] = COLUMNS + [
    ("splits", 8, lambda s, _: str(len(s.splits))),
    ("replicas", 10, lambda s, _: str(s.replicas)),
    ("devices used", 14, lambda s, _: f"{sum(1 for n in s.ops_per_device().values() if n)}"
                                      f"/{len(s.devices)}"),
    ("ops per device", 18, lambda s, _: "/".join(map(str, s.ops_per_device().values()))),
]


def table(chosen: Strategy, others: dict[str, Strategy | str],
          columns: Sequence[Column] = COLUMNS) -> list[str]:
    """One row per strategy (the chosen one marked ``*``), then those not computed."""
    dp = others.get("data-parallel") if chosen.name != "data-parallel" else chosen
    base = dp.predicted_step_time_s if isinstance(dp, Strategy) else None
    lines = [f"{'strategy':<15}" + "".join(f"{h:>{w}}" for h, w, _ in columns)]
    for s in [chosen] + list(others.values()):
        if isinstance(s, Strategy):
            name = s.name + (" *" if s is chosen else "")
            lines.append(f"{name:<15}" + "".join(f"{cell(s, base):>{w}}"
                                                  for _, w, cell in columns))
    lines += [f"{name + ' ':<15}not computed: {s}" for name, s in others.items()
              if isinstance(s, str)]
    lines += [f"{s.name}: {s.note}" for s in [chosen] + list(others.values())
              if isinstance(s, Strategy) and s.note]
    lines += [f"{s.name}: {_priorities(s.transfer_priorities)}"
              for s in [chosen] + list(others.values())
              if isinstance(s, Strategy) and s.transfer_priorities]
    return lines


def _priorities(t: dict[str, Any]) -> str:
    """What ordering a plan's weight transfers by need gave."""
    with_, without = 1e3 * t["simulated_step_time_s"], 1e3 * t["simulated_without_s"]
    return (f"{t['transfers']} weight transfers over {t['links']} links "
            + ("sent in the order their consumers need them" if t["kept"] else
               "left in TensorFlow's order") + f" (simulated {with_:.2f} ms ordered, "
            f"{without:.2f} ms not)")


def _head(graph: Graph, spec: str, chosen: Strategy) -> str:
    return (f"graph {graph.name or '<graph>'}: {len(graph)} ops; devices {spec} "
            f"({len(chosen.devices)})")


def report(graph: Graph, spec: str, chosen: Strategy, others: dict[str, Strategy | str]) -> str:
    lines = [_head(graph, spec, chosen), ""] + table(chosen, others) + [""]
    if chosen.splits:
        lines.append(f"splits ({len(chosen.splits)}):")
        lines.extend(f"  {s.op}  on {s.dim} into {s.n}" for s in chosen.splits)
    else:
        lines.append("splits: none")
    if chosen.micro_batches > 1:
        lines.append(f"accumulated, so that the plan fits its devices: each replica's share "
                     f"of the batch as {chosen.micro_batches} micro-batches in turn")
    if chosen.recomputed:
        lines.append(f"recomputed in the backward pass, so that the plan fits its devices: "
                     f"{chosen.recomputed} forward ops")
    if chosen.kept_whole:
        lines.append(f"kept whole, not replicated ({len(chosen.kept_whole)}): "
                     + ", ".join(chosen.kept_whole))
    lines.append("ops per device: " + ", ".join(
        f"{devnames.short(d)}: {n}" for d, n in chosen.ops_per_device().items()))
    return "\n".join(lines)


def compare(graph: Graph, spec: str, chosen: Strategy,
            others: dict[str, Strategy | str]) -> str:
    """Every strategy side by side (``fastt compare``)."""
    return "\n".join([_head(graph, spec, chosen), ""] + table(chosen, others, WIDE))


def write_dumps(root: str, setup: Setup, strategies: Sequence[Strategy],
                progress: Any = None) -> list[str]:
    """A strategy dump (``strategy-<k>/``, status ``planned``) per strategy in ``root``:
    document, predicted trace, placed graph, cost models when they come from a file, report.
    The paths written."""
    from fastt.inspect import trace, writer
    session = f"plan-{os.getpid()}"
    history = [writer.history_entry(k, s.name, "planned", s.predicted_step_time_s)
               for k, s in enumerate(strategies, 1)]
    original = setup.graph.fan_in(setup.fetches)
    paths = []
    for k, s in enumerate(strategies, 1):
        if progress:
            progress(s.name)
        path = writer.new_dir(root)
        history[k - 1]["dump"] = os.path.basename(path)
        doc = writer.document(s, source="plan", session=session, n=k, status="planned",
                             history=history)
        predicted = functools.partial(trace.predicted, s, setup.devices.devices, setup.costs,
                                      original, setup.devices.copy_bytes_per_s)
        writer.write(path, doc, strategy=s, models=setup.models, predicted=predicted,
                    report=False, strict=True)
        paths.append(path)
    for path in paths:  # every report shows the whole history
        writer.refresh(path, strict=True)
    return paths


def write_json(path: str, chosen: Strategy, others: dict[str, Strategy | str]) -> None:
    """The strategy document of ``--json``, with every baseline's step times."""
    doc = chosen.to_dict()
    doc["baselines"] = {n: s.predicted_step_time_s for n, s in others.items()
                        if isinstance(s, Strategy)}
    doc["baselines_simulated"] = {n: s.simulated_step_time_s for n, s in others.items()
                                  if isinstance(s, Strategy)}
    with writing(path, "--json file"), open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
