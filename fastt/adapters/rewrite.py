"""Apply a strategy to a TensorFlow graph: the GraphDef an inner session will run.

The planned training step (data-parallel replicas, splits, placement) replaces the original
ops it covers; every other op (initializers, savers, summaries) is kept as it was, and keeps
its colocation hints so that TensorFlow places it next to its variables. A join that planning
dropped because no planned op reads it is rebuilt, next to its first part, so the user can
still fetch that op by name. With ``enforce_order``, each device runs its planned ops in the
strategy's order, through the fewest control dependencies that make it so (none where the
graph already orders two ops), added between planned ops only: a run that fetches something
else drags in nothing of the training step beyond what precedes it.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from tensorflow.core.framework import graph_pb2

from fastt.adapters.export import to_graph_def
from fastt.adapters.fusion import fusion_groups, fusion_hazard
from fastt.errors import FasttError
from fastt.ir import Graph, Op, writes_variable
from fastt.op_types import BATCH_SOURCES, FREE, MERGE_TARGETS
from fastt.passes.allreduce import sync_writes
from fastt.passes.data_parallel import batch_inputs
from fastt.sched.strategy import Strategy
from tf_patches.priority_executor import PRIORITY_ATTR


def merged_graph(original: Graph, strategy: Strategy) -> Graph:
    """The planned step plus the original ops it does not cover (and joins they need)."""
    planned = strategy.graph
    ops: dict[str, Op] = {op.name: op for op in planned}
    dropped = planned.meta.dropped_joins
    for op in original:
        if op.name not in ops and op.name not in dropped:
            ops[op.name] = op
    for name, join in dropped.items():  # every original name stays fetchable (a join, a gate)
        if name not in ops:
            first = join.inputs[0].op if join.inputs else join.control_inputs[0]
            ops[name] = join.with_(device=strategy.placement.get(first, join.device))
    return sync_writes(Graph(ops.values(), name=original.name, meta=planned.meta))


def _implied(preds: dict[str, list[str]], pos: dict[str, int], a: str, b: str) -> bool:
    """Whether ``a`` already runs before ``b`` (``a`` is an ancestor of ``b``)."""
    stack, seen, floor = [b], {b}, pos[a]
    while stack:
        for p in preds[stack.pop()]:
            if p == a:
                return True
            if p not in seen and pos.get(p, -1) > floor:
                seen.add(p)
                stack.append(p)
    return False


def _downstream(graph: Graph, sources: list[str]) -> set[str]:
    seen, stack = set(sources), list(sources)
    while stack:
        for s in graph.successors(stack.pop()):
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return seen


def shared_ops(graph: Graph, planned: Graph) -> set[str]:
    """Planned ops that runs independent of the training data also need (the variable handles
    an initializer assigns, what a saver reads): they must not wait for the step. Ops that
    depend on the input batch (summaries, unused gradient branches, joins rebuilt for fetches)
    need the forward pass anyway and do not count."""
    found = batch_inputs(graph)
    fed = _downstream(graph, [op.name for op in graph if op.type in BATCH_SOURCES]
                      + ([r.op for r in found[1]] if found else []))
    independent = [op.name for op in graph if op.name not in planned and op.name not in fed]
    return set(graph.fan_in(independent).names) & set(planned.names) if independent else set()


def chained_ops(graph: Graph, strategy: Strategy) -> set[str]:
    """The planned ops whose order is enforced: what the state-updating fetches (the train
    op) need, less the ops shared with runs independent of the data. Ops only a side fetch
    needs (the loss value) are not chained, so that fetching them alone never waits for an
    update scheduled earlier on their device."""
    step = [f for f in strategy.fetches if f.split(":")[0] in graph and
            any(writes_variable(op) for op in graph.fan_in([f]))]
    core = set(graph.fan_in(step).names) if step else set(strategy.graph.names)
    return (core & set(strategy.graph.names)) - shared_ops(graph, strategy.graph)


def order_edges(graph: Graph, strategy: Strategy) -> dict[str, list[str]]:
    """Op -> control inputs to add so that each device runs its ops in the strategy's order
    (only ``chained_ops``; pairs that kernel fusion could close into a cycle are left
    unordered). Ops oneDNN may merge (contractions, BiasAdd, Pad) take no control input:
    they are only ordered before the next op of their device."""
    chained = chained_ops(graph, strategy)
    groups = fusion_groups(graph)
    per_device: dict[str, list[str]] = defaultdict(list)
    for name in strategy.order:
        # a batch source is fed, not run: a control edge on it would run it (a dequeue that
        # waits on the inner session's empty queue, a placeholder no one feeds)
        if name in chained and graph[name].type not in FREE | BATCH_SOURCES:
            per_device[strategy.placement[name]].append(name)
    topo = graph.topological_order()
    pos = {n: i for i, n in enumerate(topo)}
    preds = {op.name: [r.op for r in op.inputs] + list(op.control_inputs) for op in graph}
    succs = {op.name: list(graph.successors(op.name)) for op in graph}
    # Runs that write no variable (fetching the loss, evaluating) must stay so: no edge
    # from an op downstream of a write to one that is not.
    writes = _downstream(graph, [op.name for op in graph if writes_variable(op)])
    added: dict[str, list[str]] = defaultdict(list)
    for names in per_device.values():
        for a, b in zip(names, names[1:]):
            if pos[a] >= pos[b] and _implied(preds, pos, b, a):
                raise FasttError(f"the strategy orders {a!r} before {b!r} on one device, "
                                 "but the graph makes it wait for it")
            if graph[b].type in MERGE_TARGETS or (a in writes and b not in writes):
                continue
            if (not _implied(preds, pos, a, b)
                    and not fusion_hazard(graph, groups, a, b, preds, succs)):
                added[b].append(a)
                preds[b].append(a)
                succs[a].append(b)
    return added


def check(original: Graph, strategy: Strategy) -> None:
    """Refuse, before any session runs, a strategy the rewriter cannot honour."""
    devices = set(strategy.devices)
    planned = strategy.graph
    unplaced = [n for n in planned.names if n not in strategy.placement]
    if unplaced:
        raise FasttError(f"the strategy places no device for {len(unplaced)} ops, e.g. "
                         f"{unplaced[0]!r}")
    bad = {d for d in strategy.placement.values() if d not in devices}
    if bad:
        raise FasttError(f"the strategy places ops on devices it does not list: {sorted(bad)}")
    groups: dict[str, set[str]] = defaultdict(set)
    for name, root in planned.colocation_groups().items():
        groups[root].add(strategy.placement[name])
    split = [g for g, devs in groups.items() if len(devs) > 1]
    if split:
        raise FasttError(f"colocated ops (with {split[0]!r}) are placed on different devices "
                         f"{sorted(groups[split[0]])}; TensorFlow requires one")
    missing = [s.op for s in strategy.splits if s.op not in original and
               s.op.split("/part")[0] not in original]
    if missing:
        raise FasttError(f"the split list names ops that are not in the graph: {missing[:3]}")


def keep_fit(config: Any, strategy: Strategy | None) -> bool:
    """Turn grappler off in the session ``config`` (a ``ConfigProto``) when ``strategy`` fits
    the step to the devices' memory (micro-batches, recomputation); whether it does. The
    graph grappler returns runs its ops in another order, which can hold far more at once
    than the order the plan was fitted in, while the graph as written runs as the memory model
    predicts."""
    if strategy is None or (strategy.micro_batches <= 1 and not strategy.recomputed):
        return False
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return True


def priorities(strategy: Strategy) -> dict[str, int]:
    """Op -> priority for the priority executor: earlier in the strategy's order is higher
    (the order is one list over all devices; each device's executor sees its own ops)."""
    n = len(strategy.order)
    return {name: n - i for i, name in enumerate(strategy.order)}


def rewrite(original: Graph, strategy: Strategy, enforce_order: bool = False,
            priority: bool = False, merged: Graph | None = None) -> graph_pb2.GraphDef:
    """The GraphDef running ``strategy`` for ``original`` (checked first, see ``check``).
    The order is enforced with control dependencies (``enforce_order``) or written as
    ``_fastt_priority`` attributes for fastt's priority executor (``priority``). ``merged``:
    ``merged_graph(original, strategy)`` when the caller has it already."""
    if enforce_order and priority:
        raise FasttError("the order is enforced one way: control dependencies or priorities")
    check(original, strategy)
    graph = merged if merged is not None else merged_graph(original, strategy)
    if enforce_order:
        extra = order_edges(graph, strategy)
        graph = graph.replace_ops({n: graph[n].with_(control_inputs=graph[n].control_inputs
                                                     + tuple(c)) for n, c in extra.items()})
    gd = to_graph_def(graph, strategy.placement)
    if priority:
        ranks = priorities(strategy)
        for node in gd.node:
            if node.name in ranks:
                node.attr[PRIORITY_ATTR].i = ranks[node.name]
    return gd
