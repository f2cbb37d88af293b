"""A training step fitted into one device's memory: its batch run as micro-batches in turn
(gradient accumulation, ``fastt.passes.accumulate``), forward activations computed again in the
backward pass (recomputation, ``fastt.passes.recompute``); each priced by fastt's
memory model on one device (``peak_memory_one_device``).

``fit_step`` prefers what adds no work: accumulation first (the same operations on smaller
parts), recomputation where accumulation cannot run (batch norm in training) or does not fit.
No cost model is read: the choice is the memory model's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

from fastt.errors import Declined, DoesNotFit, FasttError
from fastt.ir import Graph
from fastt.passes.accumulate import GATE
from fastt.passes.recompute import COPY, cut_points, recompute, small_ops
from fastt.sched.search.memory_fit import accumulation_fitting, peak_memory_one_device

#: checkpoint every k-th cut point of the forward pass (``cut_points``), fewest copies
#: (smallest k) first; 0: none kept, every activation computed again from the batch and the
#: variables
SPACINGS = (1, 2, 3, 4, 6, 8, 12, 16, 0)


@dataclass
class Fitted:
    """A step's graph fitted into memory, and its predicted peak on one device (bytes)."""
    graph: Graph
    micro_batches: int  # 1: the whole batch at once
    recomputed: int  # forward ops computed again in the backward pass
    peak: float

    @property
    def note(self) -> str:
        """What was done to fit, and the peak it is predicted to hold."""
        parts = []
        if self.micro_batches > 1:
            parts.append(f"its batch as {self.micro_batches} micro-batches in turn, gradients "
                         "summed and applied once")
        if self.recomputed:
            parts.append(f"{self.recomputed} forward ops recomputed in the backward pass")
        return (" and ".join(parts) or "nothing changed") + \
            f", predicted to hold {self.peak / 2 ** 20:.1f} MiB at the peak"


def recomputation_fitting(graph: Graph, limit: float, gpu: bool = False) -> Fitted:
    """The fewest recomputed ops (checkpoints every k-th cut point, ``SPACINGS``) whose
    graph holds at most ``limit`` bytes on one device; ``DoesNotFit`` saying the least found
    when none does, ``Declined`` when nothing can be recomputed. O(|SPACINGS| x graph)."""
    best: Fitted | None = None
    for g in recomputed(graph):
        tried = Fitted(g, 1, recomputed_ops(g), peak_memory_one_device(g, gpu))
        if tried.peak <= limit:
            return tried
        best = tried if best is None or tried.peak < best.peak else best
    if best is None:
        raise Declined("no forward activation the backward pass reads can be recomputed")
    raise DoesNotFit(f"no recomputation fits {limit / 2 ** 20:.1f} MiB; the least, "
                     f"{best.peak / 2 ** 20:.1f} MiB, is {(best.peak - limit) / 2 ** 20:.1f} "
                     "MiB over")


def recomputed(graph: Graph) -> Iterator[Graph]:
    """``graph`` recomputed from every k-th cut point of its forward pass (``recomputed_at``),
    for each k of ``SPACINGS`` that recomputes something, fewest copies first."""
    cuts, small = cut_points(graph), small_ops(graph)
    for k in SPACINGS:
        try:
            yield recomputed_at(graph, k, cuts, small)
        except Declined:
            pass


def recomputed_at(graph: Graph, k: int, cuts: Sequence[str], small: Sequence[str]) -> Graph:
    """``graph`` recomputed from every k-th of its cut points ``cuts`` (0: none), its
    ``small`` ops kept (``small_ops``); ``Declined`` when there are fewer than k cut points
    or nothing is recomputed."""
    if k > max(len(cuts), 1):
        raise Declined(f"fewer than {k} cut points")
    return recompute(graph, list(cuts[k - 1::k] if k else []) + list(small))


def recomputed_ops(graph: Graph, original: Graph | None = None) -> int:
    """The forward ops ``graph`` computes again in its backward pass (``recompute``), each
    counted once however many replicas or parts run it: with ``original`` (the model graph
    ``graph`` was made from), the ops of ``original`` that have a copy."""
    copies = [n[len(COPY):] for n in graph.names if n.startswith(COPY)]
    if original is None:
        return len({n.rsplit("/part", 1)[0] for n in copies})
    found = set()
    for n in copies:  # a copy's parts and helpers are named under it: "<copy>/part1" ...
        while n and n not in original:
            n = n.rpartition("/")[0]
        found.add(n)
    return len(found - {""})


def micro_batches_of(graph: Graph, replicas: int = 1) -> int:
    """The micro-batches each of ``replicas`` runs in turn in ``graph`` (``accumulate``; 1:
    its share at once)."""
    return 1 + sum(1 for n in graph.names if n.startswith(GATE)) // max(replicas, 1)


def fit_step(graph: Graph, limit: float, gpu: bool = False) -> Fitted:
    """``graph`` (a training step) fitted to hold at most ``limit`` bytes on one device:
    gradient accumulation with the fewest micro-batches, else recomputation with the fewest
    copies; ``DoesNotFit`` naming why each fell short when neither does. (Recomputing an
    accumulated graph held more than accumulating alone on the models tried: its copies of a
    micro-batch's forward pass wait for the backward pass that comes after every
    micro-batch.)"""
    why: list[str] = []
    for fit in (lambda: _accumulated(graph, limit, gpu),
                lambda: recomputation_fitting(graph, limit, gpu)):
        try:
            return fit()
        except FasttError as e:
            why.append(str(e))
    raise DoesNotFit("; ".join(why))


def _accumulated(graph: Graph, limit: float, gpu: bool) -> Fitted:
    acc = accumulation_fitting(graph, limit, gpu)
    return Fitted(acc.graph, acc.micro_batches, 0, acc.peak)
