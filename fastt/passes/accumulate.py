"""Gradient accumulation on the IR: the step's batch run as m micro-batches one after another,
their weight gradients summed and applied once.

``accumulate(graph, m)`` is the data-parallel graph of m replicas (``data_parallel``: micro-batch
k is replica k, the weight gradients summed before the one update, ops without a batch rule
run once on the whole batch behind a join) with a gate between micro-batches: the first ops of
micro-batch k wait for micro-batch k - 1, so that one micro-batch's activations are live at a
time on a device. It computes what the original computes, up to the reassociation of the
gradients' sums.

What ties a micro-batch's backward pass to every micro-batch's forward pass without using
their values is cut:

- ``OnesLike``/``ZerosLike`` of a tensor become a ``Fill`` of its shape, which the data-parallel
  graph reads from the batch input (a mean loss's count of examples, ``tf.losses``);
- the control edges into the ops a micro-batch needs, from ops that need a later micro-batch
  (``tf.gradients``' per-op gates, the seed's wait for the loss), move to the variables'
  updates: what they ordered before the updates still runs before them.

An op of micro-batch k that needs a later micro-batch by value (the gradient of a loss's
weights needs every example's loss) is left out of what the gate waits for; its inputs stay
live until it runs. Batch norm in training normalises every micro-batch with the whole batch's
statistics (``sync_batch_norm``): each micro-batch's forward pass would need all the others',
so such a graph is declined (``Declined``, naming the op).
"""
from __future__ import annotations

from dataclasses import replace

from fastt.errors import Declined, GraphStructureError
from fastt.ir import Graph, Op, OpMeta, TensorRef, TensorSpec, writes_variable
from fastt.passes.data_parallel import data_parallel
from fastt.passes.replicas import replica_of
from fastt.passes.sync_batch_norm import FORWARD, training

GATE = "fastt_accumulate/after_micro_batch"  # the gate after micro-batch k: f"{GATE}{k}"
HELD = "fastt_accumulate/before_updates"  # what the cut control edges ordered
FILLED = {"OnesLike": 1, "ZerosLike": 0}


def accumulate(graph: Graph, m: int, lanes: int = 1) -> Graph:
    """``graph`` with its batch run as ``m`` micro-batches in turn (see the module docstring);
    ``Declined`` where micro-batches cannot run in turn, ``NoBatch`` where the batch cannot be
    cut into ``m``. With ``lanes``, the batch is cut into ``m * lanes`` micro-batches, part k
    in lane ``k % lanes`` (the data-parallel replica ``k % lanes``, which
    ``baselines.replica_devices`` puts on its own device): each lane runs its m in turn and
    sums its gradients, and the lanes' sums are added once (data parallelism with
    accumulation): each op's replica is its lane, so that ``all_reduce(g, lanes)`` mirrors
    the weights and sums the lanes' sums along a ring as for ``data_parallel``'s replicas.
    O(m * lanes + ops + edges)."""
    if m < 2:
        return graph if lanes < 2 else data_parallel(graph, lanes)
    trained = [op.name for op in graph if op.type in FORWARD and training(op)]
    if trained:
        raise Declined(
            f"batch norm in training ({trained[0]}) normalises with the whole batch's "
            f"statistics, so micro-batches cannot run one after another")
    n = m * lanes
    dp = data_parallel(fills(graph), n)
    part = {op.name: replica_of(op) for op in dp}
    dp, held = _cut_control(dp, part)
    dp = _running_sums(dp, part, n, lanes)
    latest = _latest(dp, part, control=True)
    # micro-batch k's ops that need no later micro-batch, and those of them the rest wait for
    early = {n for n, k in part.items() if k is not None and latest[n] == k}
    consumed = {s for n in early for s in dp.predecessors(n) if part.get(s) == part[n]}
    sinks: list[list[str]] = [[] for _ in range(n)]
    for op in dp:
        if op.name in early and op.name not in consumed:
            sinks[part[op.name] or 0].append(op.name)
    made = [Op(name=f"{GATE}{k}", type="NoOp", control_inputs=tuple(sinks[k]),
               meta=OpMeta(fraction=0.0, replica=k % lanes if lanes > 1 else None))
            for k in range(n - lanes)]
    if held:
        made.append(Op(name=HELD, type="NoOp", control_inputs=tuple(sorted(held)),
                       meta=OpMeta(fraction=0.0)))
    ops: list[Op] = []
    for op in dp:
        k = part[op.name]
        if k is not None and lanes <= k < n and not any(part[s] == k
                                                        for s in dp.predecessors(op.name)):
            op = op.with_(control_inputs=op.control_inputs + (f"{GATE}{k - lanes}",))
        if held and writes_variable(op) and latest[op.name] >= 0:  # the step's updates
            op = op.with_(control_inputs=op.control_inputs + (HELD,))
        ops.append(op)
    if lanes > 1:  # replica = lane: the graph is ``data_parallel(graph, lanes)``'s shape
        ops = [op if (k := part.get(op.name)) is None else
               op.with_(meta=replace(op.meta, replica=k % lanes)) for op in ops]
    out = Graph(ops + made, name=graph.name, meta=graph.meta)
    try:
        order = out.topological_order()
    except GraphStructureError as e:
        raise Declined(f"the {m} micro-batches cannot run one after another ({e})") from None
    return Graph([out[n] for n in order], name=graph.name, meta=graph.meta, like=out)


def fills(graph: Graph) -> Graph:
    """``OnesLike``/``ZerosLike`` of tensors of known rank as a ``Fill`` of their shape (same
    name, same value, no wait for the tensor's value)."""
    ops: list[Op] = []
    changed = False
    for op in graph:
        t = graph.tensor(op.inputs[0]) if op.type in FILLED and op.inputs else None
        if t is None or t.shape is None or t.dtype in ("bool", "string", "resource", "variant"):
            ops.append(op)
            continue
        changed = True
        shape, value = f"{op.name}/fastt_shape", f"{op.name}/fastt_value"
        ops += [Op(name=shape, type="Shape", inputs=op.inputs,
                   outputs=(TensorSpec("int32", (len(t.shape),)),), device=op.device,
                   attrs={"T": t.dtype, "out_type": "int32"}),
                Op(name=value, type="Const", outputs=(TensorSpec(t.dtype, ()),),
                   device=op.device, attrs={"value": FILLED[op.type], "dtype": t.dtype}),
                op.with_(type="Fill", inputs=(TensorRef(shape, 0), TensorRef(value, 0)),
                         node_def=None, attrs={"T": t.dtype})]
    return Graph(ops, name=graph.name, meta=graph.meta, like=graph) if changed else graph


def _running_sums(dp: Graph, part: dict[str, int | None], n: int, lanes: int = 1) -> Graph:
    """Each sum of the n micro-batches' parts (a weight's gradient) as a running sum per
    lane (the parts k, k + lanes, ...), the sum of part k made in part k (``part`` updated),
    so that one partial gradient per weight is live at a time in a lane; the lanes' sums
    added last, under the sum's name (one lane: its last running sum). TensorFlow's ``AddN``
    adds its inputs in order, so with one lane the value is the same."""
    changed: dict[str, Op] = {}
    made: list[Op] = []
    for op in dp:
        if op.type != "AddN" or part[op.name] is not None or len(op.inputs) != n or \
                [part[r.op] for r in op.inputs] != list(range(n)):
            continue
        totals = []
        for lane in range(lanes):
            ks = list(range(lane, n, lanes))
            total = op.inputs[ks[0]]
            for k in ks[1:]:
                last = lanes == 1 and k == ks[-1]
                name = op.name if last else f"{op.name}/fastt_sum{k}"
                summed = op.with_(name=name, inputs=(total, op.inputs[k]), node_def=None,
                                  control_inputs=op.control_inputs if last else (),
                                  meta=OpMeta(origin=op.meta.origin or op.name,
                                              fraction=lanes / (n - lanes), replica=k))
                part[name] = k
                if last:
                    changed[op.name] = summed
                else:
                    made.append(summed)
                total = TensorRef(name, 0)
            totals.append(total)
        if lanes > 1:
            changed[op.name] = op.with_(inputs=tuple(totals), node_def=None)
    if not changed:
        return dp
    return Graph([changed.get(op.name, op) for op in dp] + made, name=dp.name, meta=dp.meta)


def _latest(graph: Graph, part: dict[str, int | None], control: bool) -> dict[str, int]:
    """The latest micro-batch each op depends on (its own included; -1: none), through its
    data inputs and, with ``control``, its control inputs (a loop's back edge read as none)."""
    latest: dict[str, int] = {}
    for name in graph.topological_order():
        k = part.get(name)
        sources = graph.predecessors(name) if control else [r.op for r in graph[name].inputs]
        latest[name] = max([-1 if k is None else k] + [latest.get(s, -1) for s in sources])
    return latest


def _cut_control(dp: Graph, part: dict[str, int | None]) -> tuple[Graph, set[str]]:
    """``dp`` without the control edges into stateless ops that feed a micro-batch, from ops
    that need a later micro-batch than the op's data does (and no variable's write); and the
    ops those edges came from. O(ops + edges)."""
    by_data, latest = _latest(dp, part, control=False), _latest(dp, part, control=True)
    feeds: set[str] = set()  # ops some micro-batch's op waits for
    for name in reversed(dp.topological_order()):
        if part[name] is not None or name in feeds:
            feeds.update(dp.predecessors(name))
    writes = {op.name for op in dp if writes_variable(op)}
    after_writes: set[str] = set()
    for name in dp.topological_order():
        if name in writes or any(s in after_writes for s in dp.predecessors(name)):
            after_writes.add(name)
    held: set[str] = set()
    changed: dict[str, Op] = {}
    for op in dp:
        if op.stateful or op.name not in feeds or not op.control_inputs:
            continue
        cut = [c for c in op.control_inputs if c not in after_writes and
               latest[c] > by_data[op.name]]
        if cut:
            held.update(cut)
            changed[op.name] = op.with_(control_inputs=tuple(
                c for c in op.control_inputs if c not in cut))
    return (dp.replace_ops(changed) if changed else dp), held
