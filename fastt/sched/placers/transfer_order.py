"""Priorities for the parameter transfers a step starts with (TicTac: Hashemi et al.,
"TicTac: Accelerating Distributed Deep Learning with Communication Scheduling", MLSys 2019).

When a step starts, every weight a device reads from another one is ready at once: gRPC then
carries them all together, interleaved, and the first layer's weights arrive about when the
last one's do. ``order_transfers`` sends them in the order their consumers need them: per
link direction, the weights (values read from a variable, ready at the step's start) are
sorted by the planned start of their first consumer on the receiving device and cut into
groups of at least ``group_bytes``; group g+``window`` leaves only once group g has arrived.
The order is enforced with ops TensorFlow runs anywhere (in one process and across gRPC
workers alike): on the sender, an ``Identity`` (the gate) per tensor waiting, by control
edges, for the receiver's copies of the earlier group; on the receiver, an ``Identity`` (the
copy) its consumers read instead. The gates and copies move no bytes and run on a stream of
their own (``Problem.stream``), so they never hold a device's enforced order; the control
messages back to the sender are transfers the simulator sees.

The order is Jackson's rule (earliest due date): with every weight ready at the start and one
link carrying them in turn, sending them by need minimises the largest wait of any consumer.
It is not always the fastest step (a weight needed late may take so long to send that it
should leave before the ones needed just before it), hence the planner's "auto": keep the
order only where the simulator replays it faster. Only weights are ordered: a tensor computed
in the step leaves when it is computed, which is already about when its consumer needs it.
O(V + E + T log T) for T weight transfers.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from fastt import dtypes
from fastt.errors import FasttError
from fastt.ir import Graph, Op, OpMeta, TensorRef
from fastt.op_types import READS
from fastt.sched.sim.extend import extended
from fastt.sched.sim.problem import TRANSFER_SCOPE as SCOPE
from fastt.sched.sim.problem import Problem
from fastt.sched.sim.simulate import replay_placement, replay_run

GROUP_BYTES = 2 ** 20  # a group's bytes take longer than the control message's round trip
WINDOW = 1  # groups in flight per link direction


@dataclass(frozen=True)
class WeightTransfer:
    """A weight ``tensor`` read on device ``src`` and needed on ``dst`` from ``need``."""
    tensor: TensorRef
    src: str
    dst: str
    nbytes: int
    need: float


def _at_step_start(graph: Graph, op: Op) -> bool:
    """A variable, or a read of one: its value is ready when the step starts."""
    if op.is_variable:
        return True
    return (op.type in READS and not op.control_inputs and bool(op.inputs)
            and all(graph[r.op].is_variable for r in op.inputs))


def weight_transfers(graph: Graph, placement: Mapping[str, str],
                     need: Mapping[str, float]) -> list[WeightTransfer]:
    """The weights ``graph`` placed by ``placement`` sends between devices, each with the
    earliest ``need`` (planned start) of its consumers on the receiving device; ops inside a
    while loop are left alone."""
    in_loop = {n for ops in graph.while_frames().values() for n in ops}
    firsts: dict[tuple[TensorRef, str], float] = {}
    weight: dict[TensorRef, bool] = {}  # whether a tensor read across devices is a weight
    for op in graph:
        if op.name in in_loop:
            continue
        dst = placement[op.name]
        for ref in op.inputs:
            if placement[ref.op] == dst:
                continue
            known = weight.get(ref)
            if known is None:
                known = weight[ref] = _at_step_start(graph, graph[ref.op]) and \
                    not dtypes.is_ref_or_resource(graph.tensor(ref).dtype)
            if known:
                key = (ref, dst)
                firsts[key] = min(firsts.get(key, float("inf")), need.get(op.name, 0.0))
    return [WeightTransfer(ref, placement[ref.op], dst, graph.tensor(ref).nbytes or 0, t)
            for (ref, dst), t in firsts.items()]


def order_transfers(graph: Graph, placement: Mapping[str, str], need: Mapping[str, float],
                    group_bytes: float | None = None, window: int = WINDOW,
                    transfers: list[WeightTransfer] | None = None
                    ) -> tuple[Graph, dict[str, str], list[list[WeightTransfer]]]:
    """``graph`` with its weight transfers sent in the order of ``need`` (see the module
    docstring; the ops it makes come last, by when they open), the placement of its ops,
    and the transfers per link direction in their order (none: nothing to order).
    ``group_bytes``: by default ``GROUP_BYTES``, read at each call; ``transfers``: its
    ``weight_transfers`` when the caller has them."""
    group_bytes = GROUP_BYTES if group_bytes is None else group_bytes
    per_link: dict[tuple[str, str], list[WeightTransfer]] = defaultdict(list)
    if transfers is None:
        transfers = weight_transfers(graph, placement, need)
    for t in transfers:
        per_link[(t.src, t.dst)].append(t)
    made: list[tuple[tuple[float, int, int, int], Op]] = []  # (when it opens, op)
    placed = dict(placement)
    copy_of: dict[tuple[TensorRef, str], TensorRef] = {}
    chains: list[list[WeightTransfer]] = []
    for link, (pair, sent) in enumerate(sorted(per_link.items())):
        sent.sort(key=lambda t: (t.need, str(t.tensor)))
        groups: list[list[WeightTransfer]] = [[]]
        filled = 0
        for t in sent:
            groups[-1].append(t)
            filled += t.nbytes
            if filled >= group_bytes:
                groups.append([])
                filled = 0
        groups = [g for g in groups if g]
        if len(groups) < 2:
            continue  # one group has nothing to wait for
        copies: list[list[str]] = []
        for k, group in enumerate(groups):
            waits = tuple(copies[k - window]) if k >= window else ()
            names = []
            for t in group:
                base = f"{SCOPE}/{link}/{k}/{t.tensor.op.replace('/', '_')}_{t.tensor.index}"
                spec = graph.tensor(t.tensor)
                meta = OpMeta(split_of=SCOPE)
                gate = Op(name=f"{base}/gate", type="Identity", inputs=(t.tensor,),
                          control_inputs=waits, outputs=(spec,), meta=meta)
                copy = Op(name=f"{base}/copy", type="Identity",
                          inputs=(TensorRef(gate.name, 0),), outputs=(spec,), meta=meta)
                placed[gate.name], placed[copy.name] = pair
                made += [((group[0].need, link, k, 0), gate), ((group[0].need, link, k, 1), copy)]
                copy_of[(t.tensor, pair[1])] = TensorRef(copy.name, 0)
                names.append(copy.name)
            copies.append(names)
        chains.append([t for g in groups for t in g])
    if not made:
        return graph, placed, []
    copied = {ref for ref, _ in copy_of}
    ops = []
    for op in graph:
        if copied.isdisjoint(op.inputs):
            ops.append(op)
            continue
        dst = placement[op.name]
        inputs = tuple(copy_of.get((r, dst), r) for r in op.inputs)
        ops.append(op if inputs == op.inputs else op.with_(inputs=inputs))
    made.sort(key=lambda m: m[0])  # by when they open: each device's gates in chain order
    return Graph(ops + [op for _, op in made], name=graph.name, meta=graph.meta,
                 like=graph), placed, \
        chains


def _may_group(transfers: list[WeightTransfer], group_bytes: float | None = None) -> bool:
    """Whether some link direction may carry two groups of ``transfers`` (in some order of
    need): its bytes but its smallest transfer's fill a group."""
    group_bytes = GROUP_BYTES if group_bytes is None else group_bytes
    per_link: dict[tuple[str, str], list[int]] = defaultdict(list)
    for t in transfers:
        per_link[(t.src, t.dst)].append(t.nbytes)
    return any(len(b) > 1 and sum(b) - min(b) >= group_bytes for b in per_link.values())


MODES = ("auto", "on", "off")


@dataclass
class Prioritized:
    """A plan with its weight transfers ordered (``order_transfers``), or not."""
    graph: Graph
    placement: dict[str, str]
    order: list[str]
    times: tuple[float, float]  # its replay: free links, one transfer at a time
    chains: list[list[WeightTransfer]]
    without: tuple[float, float]  # the same replay of the plan as it was
    kept: bool

    def summary(self) -> dict[str, object]:
        """What the dumps say of it."""
        return {"transfers": sum(len(c) for c in self.chains), "links": len(self.chains),
                "kept": self.kept, "simulated_step_time_s": self.times[1],
                "simulated_without_s": self.without[1]}


def prioritize(graph: Graph, p: Problem, device: list[int], order: list[int], ordered: bool,
               compile_graph: Callable[[Graph], Problem], times: tuple[float, float],
               mode: str = "auto", planned: Sequence[float] | None = None
               ) -> Prioritized | None:
    """The plan of ``graph`` (compiled as ``p``; op i on ``device[i]``, ``order`` the
    execution list, enforced when ``ordered``) with its weight transfers ordered by need,
    kept with ``mode`` "on", or with "auto" when the simulator replays it faster with one
    transfer at a time per link (``times``: the plan's own replays; ``planned``: each op's
    start in its replay with free links, when the caller has it). None when ``mode`` is
    "off" or no link carries two groups of weights."""
    if mode not in MODES:
        raise FasttError(f"transfer priorities must be one of {', '.join(MODES)}, "
                         f"not {mode!r}")
    if mode == "off":
        return None
    names = [d.name for d in p.devices]
    placement = {n: names[device[i]] for i, n in enumerate(p.names)}
    if planned is None:
        if not _may_group(weight_transfers(graph, placement, {})):
            return None  # the replay below would find nothing to order
        # when each consumer would start were the links free: a replay where the links
        # queue would make a weight sent late look needed late
        planned = replay_run(p, device, order if ordered else None, None).start
    need = dict(zip(p.names, planned))
    transfers = weight_transfers(graph, placement, need)
    if not _may_group(transfers):
        return None  # the replays below would find nothing to order
    g2, placed, chains = order_transfers(graph, placement, need, transfers=transfers)
    if not chains:
        return None
    p2 = extended(p, graph, g2, compile_graph)  # its ops but the gates compiled already
    index = {n: d for d, n in enumerate(names)}
    device2 = [index[placed[n]] for n in p2.names]
    pos = {n: i for i, n in enumerate(p2.names)}
    made = [pos[n] for n in g2.names[len(graph):]]  # first: they only open transfers
    order2 = made + [pos[p.names[i]] for i in order]
    times2 = replay_placement(p2, device2, order2 if ordered else None)
    kept = mode == "on" or times2[::-1] < times[::-1]
    return Prioritized(g2 if kept else graph, placed if kept else placement,
                       [p2.names[i] for i in order2] if kept else [p.names[i] for i in order],
                       times2, chains, times, kept)

