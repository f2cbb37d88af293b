"""Data parallelism where a replica does not fit its device (``fitted_layout``): each replica's
share run as micro-batches in turn, gradients summed per device and then once across the
devices (``accumulate(graph, m, lanes=devices)``: summed on device 0, or mirrored and
all-reduced along the ring), or the model graph recomputed from its cut points
(``fastt.passes.recompute``) and replicated again: of the two that fit, the faster.
Recomputation is a rewrite of the model graph alone, so it composes with every layout, placer
and split that follows.

Each candidate costs a data-parallel graph and its simulated peaks to check; for
recomputation a cheap estimate comes first: what the recomputed model graph saves on one
device at the whole batch (``peak_memory_one_device``), a share of it per replica.
"""
from __future__ import annotations

import functools
from typing import Sequence

from fastt.errors import Declined, DoesNotFit, NoBatch
from fastt.ir import Graph
from fastt.passes.accumulate import accumulate
from fastt.passes.data_parallel import batch_size, data_parallel
from fastt.passes.recompute import cut_points, small_ops
from fastt.sched.search.memory_fit import (ACCUMULATED_OPS, MICRO_BATCH_COUNTS,
                                           data_parallel_peaks, peak_memory_one_device)
from fastt.sched.registry import KINDS
from fastt.sched.search.osdpos import clock
from fastt.sched.search.planning import Planning
from fastt.sched.search.step_fitting import SPACINGS, recomputed_at, recomputed_ops
from fastt.sched.sim.problem import Device

MiB = 2 ** 20


def over(peaks: Sequence[float], devices: Sequence[Device]) -> float:
    """Bytes by which the fullest device is over its memory (<= 0: every device holds its
    share)."""
    return max(m - d.memory for m, d in zip(peaks, devices))


def fitted_layout(shared: Planning, name: str, peaks: Sequence[float]) -> Graph:
    """Layout ``name`` of the graph fitted into its devices, its plain replicas holding
    ``peaks``: accumulated with the fewest micro-batches that fit (where the batch norms
    allow), or recomputed (``recomputed_layout``), whichever of the two that fit runs the
    shorter simulated step (once accumulation fits, recomputation is tried only where as
    long again ends before the deadline); ``DoesNotFit`` saying by how much the least is
    over."""
    why = ""
    fits: list[Graph] = []
    began = clock()
    try:
        fits.append(accumulated_layout(shared, name, peaks))
    except (Declined, DoesNotFit, NoBatch) as e:
        why = f"; {e}"
    if fits and shared.late(clock() - began):  # recomputing costs about what that took
        return fits[0]
    try:
        fits.append(recomputed_layout(shared, name, peaks))
    except DoesNotFit as e:
        if not fits:
            raise DoesNotFit(f"{e}{why}") from None
    return min(fits, key=lambda g: layout_step_time(shared, name, g))


def layout_step_time(shared: Planning, name: str, g: Graph) -> float:
    """The simulated step of layout ``name``'s graph ``g`` (its own placer's schedule;
    infinite where that does not fit)."""
    try:
        return shared.replay(shared.compile(g), shared.place(KINDS[name], g))[1]
    except DoesNotFit:
        return float("inf")


def accumulated_layout(shared: Planning, name: str, peaks: Sequence[float]) -> Graph:
    """Layout ``name`` with each device's share of the batch run as m micro-batches in turn
    (``MICRO_BATCH_COUNTS``, fewest first, at most ``ACCUMULATED_OPS`` ops), each device's
    gradients summed as they come: the first m whose replicas fit; ``DoesNotFit`` (the least
    over) when none does, ``Declined`` where micro-batches cannot run in turn (batch norm in
    training)."""
    devices, D = shared.devices, len(shared.devices)
    B = batch_size(shared.graph)
    least = over(peaks, devices)
    for m in MICRO_BATCH_COUNTS:
        if m * D > B or m * D * len(shared.graph) > ACCUMULATED_OPS:
            break
        g = shared.cached(("accumulated", m), functools.partial(accumulate, shared.graph, m, D))
        dp, got = data_parallel_peaks(shared.graph, devices, name == "data-parallel",
                                      shared.bucket_bytes, g, shared.compile)
        if over(got, devices) <= 0:
            return dp
        if over(got, devices) > 0.98 * least:
            break  # no longer falling: the variables and their gradients dominate
        least = over(got, devices)
    raise DoesNotFit(f"with its gradients accumulated the fullest still needs "
                     f"{least / MiB:.1f} MiB more")


def recomputed_layout(shared: Planning, name: str, peaks: Sequence[float]) -> Graph:
    """Layout ``name`` of the model graph recomputed from every k-th cut point (``SPACINGS``:
    the fewest copies first) that every device holds, its plain replicas holding ``peaks``;
    ``DoesNotFit`` saying the least over when none does. Those estimated to fit are checked
    first, fewest copies first, then the others, likeliest first; past the deadline no more
    than one."""
    devices, D = shared.devices, len(shared.devices)
    whole = shared.cached(("peak one", ), lambda: _gpu_peak(shared.graph, devices))
    cands: list[tuple[float, int, Graph]] = []  # (estimated bytes over, k, graph)
    for k in SPACINGS:
        try:
            g = _recomputed(shared, k)
        except Declined:
            continue
        saved = whole - shared.cached(("peak one", k), functools.partial(_gpu_peak, g, devices))
        cands.append((over(peaks, devices) - saved / D, k, g))
    need = (f"data parallelism needs every replica (the model with its share of the batch) "
            f"to fit one device ({D} devices given)")
    if not cands:
        raise DoesNotFit(f"{need}; the fullest needs {over(peaks, devices) / MiB:.1f} MiB "
                         "more, and no forward activation the backward pass reads can be "
                         "recomputed")
    least: tuple[float, int] | None = None
    # those estimated to fit in SPACINGS' order (fewest copies first), then the likeliest
    ranked = [c for c in cands if c[0] <= 0] + sorted((c for c in cands if c[0] > 0),
                                                      key=lambda c: c[0])
    for _, k, g in ranked:
        if least is not None and shared.late():
            break
        replicas = shared.cached(("recomputed replicas", k),
                                 functools.partial(data_parallel, g, D))
        dp, got = data_parallel_peaks(g, devices, name == "data-parallel",
                                      shared.bucket_bytes, replicas, shared.compile)
        if over(got, devices) <= 0:
            return dp
        if least is None or over(got, devices) < least[0]:
            least = (over(got, devices), recomputed_ops(g))
    assert least is not None
    raise DoesNotFit(f"{need}; with {least[1]} forward ops recomputed the fullest still "
                     f"needs {least[0] / MiB:.1f} MiB more")


def _recomputed(shared: Planning, k: int) -> Graph:
    """The model graph recomputed from every k-th of its cut points (``recomputed_at``)."""
    cuts, small = shared.cached(("cut points",), lambda: (cut_points(shared.graph),
                                                          small_ops(shared.graph)))
    return shared.cached(("recomputed", k),
                         lambda: recomputed_at(shared.graph, k, cuts, small))


def _gpu_peak(graph: Graph, devices: Sequence[Device]) -> float:
    return peak_memory_one_device(graph, gpu=any(d.type == "GPU" for d in devices))
