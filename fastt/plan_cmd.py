"""``fastt plan``: compute a strategy for a training graph and compare it with the baselines."""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Sequence

from fastt.costs import CostModels
from fastt.errors import FasttError
from fastt.ir import Graph
from fastt.sched.device_spec import DeviceSet, StaticCosts, parse
from fastt.sched.problem import CostSource, ModelCosts
from fastt.sched.strategy import STRATEGIES, Strategy, plan

log = logging.getLogger("fastt")


def load(graph_path: str | None, model: str | None, batch_size: int | None) -> Graph:
    """The IR of a graph file, or of a zoo model built on the spot."""
    import tensorflow as tf

    from fastt.adapters import tf_import
    if graph_path:
        return tf_import.load_graph(graph_path)
    if not model:
        raise FasttError("give a graph file or --model NAME")
    from fastt import zoo
    tf.compat.v1.disable_eager_execution()
    built = zoo.build(model, **({"batch_size": batch_size} if batch_size else {}))
    g = tf_import.from_tf_graph(built.graph, name=model)
    g.payload["collections"] = {"train_op": [built.train_op.name]}
    return g


def fetches(graph: Graph, explicit: Sequence[str] = ()) -> list[str]:
    """What a training step runs: --fetch, else the MetaGraphDef's train_op collection."""
    if explicit:
        missing = [f for f in explicit if f.split(":")[0] not in graph]
        if missing:
            raise FasttError(f"--fetch names ops that are not in the graph: {missing}")
        return list(explicit)
    train = graph.payload.get("collections", {}).get("train_op")
    if train:
        return list(train)
    raise FasttError("the graph names no train op: pass --fetch OP (e.g. the optimizer's "
                     "minimize op), or save a MetaGraphDef with a train_op collection")


def cost_source(graph: Graph, device_set: DeviceSet, costs: str,
                fetch: Sequence[str]) -> CostSource:
    if costs == "analytical":
        from fastt.adapters.export import to_graph_def
        from tf_patches.grappler_costs import analytical_costs
        kind = device_set.kind if device_set.kind != "GPU" else "V100"
        seconds = analytical_costs(to_graph_def(graph), list(fetch), kind)
        return StaticCosts(seconds, device_set)
    return ModelCosts(CostModels.load(costs))


def run(graph: Graph, spec: str, strategy: str = "os-dpos", costs: str = "analytical",
        fetch: Sequence[str] = (), baselines: Sequence[str] = STRATEGIES,
        progress: Any = None) -> tuple[Strategy, dict[str, Strategy | str]]:
    """The chosen strategy and every baseline (or why it could not be computed)."""
    device_set = parse(spec)
    step = fetches(graph, fetch)
    source = cost_source(graph, device_set, costs, step)
    copy = device_set.copy_bytes_per_s
    chosen = plan(graph, device_set.devices, source, strategy, copy,
                  workers=os.cpu_count() or 1, fetches=step)
    others: dict[str, Strategy | str] = {}
    for name in baselines:
        if name == strategy:
            continue
        if progress:
            progress(name)
        try:
            others[name] = plan(graph, device_set.devices, source, name, copy, fetches=step)
        except FasttError as e:
            others[name] = str(e)
    return chosen, others


def report(graph: Graph, spec: str, chosen: Strategy, others: dict[str, Strategy | str]) -> str:
    lines = [f"graph {graph.name or '<graph>'}: {len(graph)} ops; devices {spec} "
             f"({len(chosen.devices)})", "",
             f"{'strategy':<15}{'predicted step':>16}{'with link contention':>22}"
             f"{'plan time':>12}{'vs data-parallel':>18}"]
    dp = others.get("data-parallel") if chosen.name != "data-parallel" else chosen
    base = dp.predicted_step_time_s if isinstance(dp, Strategy) else None
    for s in [chosen] + list(others.values()):
        if isinstance(s, str):
            continue
        ratio = f"{base / s.predicted_step_time_s:.2f}x" if base else "n/a"
        mark = " *" if s is chosen else ""
        lines.append(f"{s.name + mark:<15}{s.predicted_step_time_s * 1e3:>13.3f} ms"
                     f"{s.simulated_step_time_s * 1e3:>19.3f} ms{s.plan_time_s:>10.2f} s"
                     f"{ratio:>18}")
    for name, s in others.items():
        if isinstance(s, str):
            lines.append(f"{name:<15}not computed: {s}")
    lines.append("")
    if chosen.splits:
        lines.append(f"splits ({len(chosen.splits)}):")
        lines.extend(f"  {s.op}  on {s.dim} into {s.n}" for s in chosen.splits)
    else:
        lines.append("splits: none")
    lines.append("ops per device: " + ", ".join(
        f"{d.rsplit('/', 1)[-1] if d.count('/task:0/') else d}: {n}"
        for d, n in chosen.ops_per_device().items()))
    return "\n".join(lines)


def write_json(path: str, chosen: Strategy, others: dict[str, Strategy | str]) -> None:
    doc = chosen.to_dict()
    doc["baselines"] = {n: s.predicted_step_time_s for n, s in others.items()
                        if isinstance(s, Strategy)}
    doc["baselines_simulated"] = {n: s.simulated_step_time_s for n, s in others.items()
                                  if isinstance(s, Strategy)}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
