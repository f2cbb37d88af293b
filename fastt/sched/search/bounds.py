"""A lower bound on the step time of any plan fastt can make of a graph on a device set.

Two facts hold whatever the placement, the order and the splits:

- ``work``: every op runs at least once, on some device, taking at least its time on the
  fastest one; the D devices share that work at best evenly: ``sum_i min_d w[i][d] / D``.
- ``critical_path``: each chain of dependent ops runs one op after the other; with free
  transfers, an op takes at least ``min_d w[i][d]``, or that over D when fastt can cut it into
  parts that run side by side (a batch share in data parallelism, a split of OS-DPOS), since
  its parts together do at least its work (a roofline cost: a part's memory traffic does not
  shrink with its share of the flops). A shape op fastt may fold into a constant counts 0.

The bound is the larger of the two (Graham's classic pair of bounds for list scheduling, with
divisible tasks shortened), plus the step's fixed overhead. O(n + e) for n ops and e edges.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from fastt.ir import Graph
from fastt.op_types import SHAPE_OPS
from fastt.sched.sim.problem import Problem
from fastt.passes.split_rules import rules


@dataclass(frozen=True)
class Bound:
    """No plan of the graph runs a step in less than ``value`` seconds."""
    critical_path: float
    work: float
    overhead: float = 0.0

    @property
    def value(self) -> float:
        return max(self.critical_path, self.work) + self.overhead


def least_shares(graph: Graph, devices: int, data_parallel: Graph | None = None
                 ) -> dict[str, float]:
    """Per op of ``graph``, the least share of its time it can take on a chain: 0 for shape
    ops (folded), 1 / ``devices`` for ops fastt can cut into parts (a split rule, or a share
    of the batch in ``data_parallel``, the data-parallel graph); ops left out take it all."""
    cut = {op.name for op in graph if rules(op, graph)}
    if data_parallel is not None:
        cut |= {op.meta.origin for op in data_parallel
                if op.meta.origin is not None and op.meta.fraction < 1.0}
    shares = {name: 1.0 / devices for name in cut if name in graph}
    shares.update({op.name: 0.0 for op in graph if op.type in SHAPE_OPS})
    return shares


def lower_bound(p: Problem, shares: Mapping[str, float] = {}, overhead: float = 0.0) -> Bound:
    """The bound for ``p`` (its model graph compiled for the device set); ``shares``: the least
    share of each op's time (``least_shares``; 1 when absent)."""
    fastest = [min(row) for row in p.w]
    share = [shares.get(name, 1.0) for name in p.names]
    span = [f * k for f, k in zip(fastest, share)]  # on a chain: its share of its time
    work = sum(f for f, k in zip(fastest, share) if k > 0)  # done once in full, on any device
    finish = [0.0] * p.n
    for i in p.topo:
        finish[i] = max((finish[m] for m, _ in p.preds[i]), default=0.0) + span[i]
    return Bound(critical_path=max(finish, default=0.0), work=work / p.num_devices,
                 overhead=overhead)


def c_max(p: Problem) -> float:
    """The largest total transfer time along any chain of ``p``, each edge at its dearest
    device pair: the ``C_max`` of DPOS's guarantee, ``omega_DPOS <= 2 omega_opt + C_max``
    (FastT, Theorem 1; ``omega_opt`` the optimum with free transfers). O(n + e)."""
    c = p.max_comm()
    longest = [0.0] * p.n
    for i in reversed(p.topo):
        longest[i] = max((c[e] + longest[j] for j, e in p.succs[i]), default=0.0)
    return max(longest, default=0.0)
