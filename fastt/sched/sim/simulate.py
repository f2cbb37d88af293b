"""Discrete-event simulation of one training step under a placement and per-device orders.

One compute stream per device runs its ops in the given order, each as soon as its inputs are
there. A tensor needed on another device is sent once per device when its producer finishes
(tensors are cached on the receiver) over the pair's link: ``intercept + slope * bytes`` (plus
``extra`` per byte past the link's ``knee``), one transfer at a time per direction by default
(``link_concurrency=None``: unlimited, DPOS's own assumption, so replaying a DPOS schedule
reproduces its predicted finish time). Ops of another stream (``Problem.stream``: NCCL's
collectives) run beside the compute stream, in their own order; the gates of ordered weight
transfers (``TRANSFER_STREAM``) in no order, each as soon as its inputs are there. Messages
under ``SMALL_BYTES`` (statistics, scalars, shapes) queue apart from bulk tensors: on a real
link their packets interleave with those of a transfer in flight (concurrent gRPC streams, NCCL
channels) rather than wait for its last byte. Where the cores move the bytes themselves (gRPC
between processes), a transfer also takes work from the sender's and the receiver's compute
streams: a share of its bandwidth time and seconds for its call, fewer when that end moves
other transfers meanwhile (``Problem.send_cpu``/``recv_cpu``, ``call_cpu``): an idle device
spends it from the transfer's start, a busy one after the op it is running. A step pays once to
reach the devices it uses (``Problem.reach``: the master's calls to remote workers), for the
dearest of them. Devices that compute on the same cores (``Problem.cores``: the CPU devices of
one process) are replayed as devices of their own, but no step ends before those cores have
done the work of all of them.

Memory per device: persistent bytes for the whole step; an output from its producer's start
until its last consumer on that device has finished and its sends are done; a received tensor
from its transfer's start until its last consumer there has finished.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable, Sequence, Union

from fastt.errors import FasttError
from fastt.sched.sim._native import simcore as _simcore
from fastt.sched.sim.problem import TRANSFER_STREAM, Problem
from fastt.sched.sim.sim_loops import SMALL_BYTES, Needs, Transfer, fifo_loop, ordered_loop


@dataclass
class SimResult:
    start: list[float]
    finish: list[float]
    device: list[int]
    # the transfers, or how to list them when first read (most replays never do)
    _transfers: "Transfers" = field(
        default_factory=list, repr=False)
    busy: list[float] = field(default_factory=list)
    reach: float = 0.0  # what the step pays to run on the devices it uses (Problem.reach)
    shared_work: float = 0.0  # the busiest cores' work over the devices sharing them
    # the per-device peaks of live bytes, worked out when first read (most replays never do)
    _peaks: "Peaks | None" = field(default=None, repr=False)
    _peak_memory: list[float] | None = field(default=None, repr=False)

    @property
    def transfers(self) -> list[Transfer]:
        """Every transfer the replay made, in the order they were sent."""
        if callable(self._transfers):
            self._transfers = self._transfers()
        return self._transfers

    @property
    def peak_memory(self) -> list[float]:
        """Per device, the peak bytes held: variables plus live tensors."""
        if self._peak_memory is None:
            self._peak_memory = self._peaks(self) if self._peaks else []
            self._peaks = None
        return self._peak_memory

    @property
    def makespan(self) -> float:
        return max(max(self.finish, default=0.0), self.shared_work) + self.reach


def simulate(p: Problem, device: list[int], orders: list[list[int]],
             link_concurrency: int | None = 1, compiled: bool = True) -> SimResult:
    """Simulate ``p`` with op ``i`` on ``device[i]``, device ``d`` running ``orders[d]``.
    O((n + e) log n) for n ops and e tensors needed: an event wakes only the devices whose
    next op it lets start. The loop runs compiled (``_simcore``) where it was built and
    ``compiled``, else in Python; both give the same times."""
    n = p.n
    listed = [i for o in orders for i in o]
    if len(listed) != n or len(set(listed)) != n or (n and not 0 <= min(listed) <= max(listed) < n):
        raise FasttError("the device orders must list every op exactly once")
    for d, order in enumerate(orders):
        if [device[i] for i in order] != [d] * len(order):
            i = next(i for i in order if device[i] != d)
            raise FasttError(f"op {p.names[i]!r} is in device {d}'s order but placed on "
                             f"device {device[i]}")

    def run(serve: list[float] | None) -> tuple[list[float], list[float], Transfers, Peaks]:
        if _simcore is not None and compiled:
            return _compiled(_simcore, p, device, orders, link_concurrency, serve_from=serve)
        start, finish, transfers, needs = ordered_loop(p, device, orders, link_concurrency,
                                                       serve)
        return start, finish, transfers, _peaks_of(p, needs)

    start, finish, transfers, peaks = _served(p, device, run)
    if min(finish, default=0.0) < 0:
        stuck = [p.names[i] for i in range(n) if finish[i] < 0][:5]
        raise FasttError(f"the orders deadlock (an op waits for one ordered after it): {stuck}")
    return _result(p, device, start, finish, transfers, peaks)


def _compiled(core: ModuleType, p: Problem, device: list[int], orders: list[list[int]] | None,
              link_concurrency: int | None, priority: Sequence[float] | None = None,
              serve_from: Sequence[float] | None = None
              ) -> tuple[list[float], list[float], Callable[[], list[Transfer]], Peaks]:
    """``simulate``'s loop (``orders`` None: ``simulate_fifo``'s) in ``core`` (``_simcore``:
    the same events, the same arithmetic), and its peaks of memory (``_peak_memory`` in
    ``core``), to work out when read."""
    flat = _flat_needs(p)
    w, D = p.w, p.num_devices
    start, finish, sent = core.simulate(
        D, device, [w[j][d] for j, d in enumerate(device)], p.stream, orders,
        *flat[:4], p.intercept, p.slope, p.knee, p.extra, p.least_knee, p.send_cpu,
        p.recv_cpu, [x for row in p.call_cpu for calls in row for x in calls], TRANSFER_STREAM,
        -1 if link_concurrency is None else link_concurrency, SMALL_BYTES, priority,
        list(serve_from) if serve_from is not None else [0.0] * D)
    keys = flat[4]
    return start, finish, lambda: [Transfer(keys[k], a, b, x, t0, t1)
                                   for k, a, b, x, t0, t1 in zip(*sent)], \
        lambda r: core.peaks(D, r.device, r.start, r.finish, *flat[:4], *sent, p.persistent)


def simulate_fifo(p: Problem, device: list[int], link_concurrency: int | None = 1,
                  priority: Sequence[float] | None = None, compiled: bool = True) -> SimResult:
    """Simulate ``p`` with op ``i`` on ``device[i]`` and no enforced order: like TensorFlow's
    own executor, each device runs its ready ops first come, first served (ties by op
    index: graph order); with ``priority``, the ready op of highest priority first (a
    priority executor). O((n + e) log n) for n ops and e edges. Compiled as ``simulate``."""

    def run(serve: list[float] | None) -> tuple[list[float], list[float], Transfers, Peaks]:
        if _simcore is not None and compiled:
            return _compiled(_simcore, p, device, None, link_concurrency, priority, serve)
        start, finish, transfers, needs = fifo_loop(p, device, link_concurrency, priority,
                                                    serve)
        return start, finish, transfers, _peaks_of(p, needs)

    return _result(p, device, *_served(p, device, run))


# A pause of the executor long enough for gRPC's threads to take requests; a replay's shorter
# gaps are mostly the calls' own CPU (0.02-0.07 ms each) it charges between ops.
IDLE_GAP = 2e-4


def serve_from(p: Problem, device: list[int], start: list[float], finish: list[float]
               ) -> list[float] | None:
    """Per device, the earliest a transfer leaves it in a step (None: no device delays any).

    A receiver asks for each tensor it needs when its step starts; where the cores move the
    bytes (gRPC between one-core workers), the sender's gRPC threads take the request only
    once its executor leaves the core: at its first pause (``IDLE_GAP`` or longer), or after
    ``Problem.serve_delay`` (the scheduler's time slice), whichever comes first. A tensor
    produced before then waits (a data-parallel step's input slice waited 3.2 ms here while
    its sender ran a 3.6 ms convolution). From a replay without it: O(n log n)."""
    if not any(p.serve_delay):
        return None
    spans: list[list[tuple[float, float]]] = [[] for _ in range(p.num_devices)]
    for i, d in enumerate(device):
        if p.w[i][d] > 0 and not p.stream[i]:
            spans[d].append((start[i], finish[i]))
    out = []
    for d, delay in enumerate(p.serve_delay):
        pause, reach = None, 0.0
        for a, b in sorted(spans[d]):
            if a > reach + IDLE_GAP:
                pause = reach
                break
            reach = max(reach, b)
        out.append(min(delay, reach if pause is None else pause))
    return out if any(out) else None


def _served(p: Problem, device: list[int],
            run: Callable[[list[float] | None], tuple[list[float], list[float], Transfers,
                                                      Peaks]]
            ) -> tuple[list[float], list[float], Transfers, Peaks]:
    """``run``'s replay, again with ``serve_from`` where it delays a device's transfers."""
    first = run(None)
    late = serve_from(p, device, first[0], first[1])
    return first if late is None else run(late)


def replay_run(p: Problem, device: list[int], order: list[int] | None,
               link_concurrency: int | None) -> SimResult:
    """Op i of ``p`` on ``device[i]`` run in ``order`` (None: first come, first served)."""
    if order is None:
        return simulate_fifo(p, device, link_concurrency=link_concurrency)
    orders: list[list[int]] = [[] for _ in range(p.num_devices)]
    for i in order:
        orders[device[i]].append(i)
    return simulate(p, device, orders, link_concurrency=link_concurrency)


def replay_runs(p: Problem, device: list[int], order: list[int] | None
                ) -> tuple[SimResult, SimResult]:
    """``replay_run`` with free links and with one transfer at a time per link direction."""
    return replay_run(p, device, order, None), replay_run(p, device, order, 1)


def replay_placement(p: Problem, device: list[int], order: list[int] | None
                     ) -> tuple[float, float]:
    """The makespans of ``replay_runs``."""
    free, queued = replay_runs(p, device, order)
    return free.makespan, queued.makespan


Flat = tuple[list[int], list[int], list[int], list[float], list[object]]
Transfers = Union[list[Transfer], Callable[[], list[Transfer]]]  # or how to list them
Peaks = Callable[[SimResult], list[float]]  # a replay's peaks of memory, from its result


def _flat_needs(p: Problem, compiled: bool = True) -> Flat:
    """``needs_of`` as ``_simcore`` reads them: each op's first need's offset (and the end),
    the needs' producers, key numbers and bytes; and the keys by number. Once per problem,
    by ``_simcore`` where it was built and ``compiled``, else in Python (not kept)."""
    if _simcore is None or not compiled:
        return _python_flat_needs(p)
    flat: Flat | None = getattr(p, "_flat", None)
    if flat is None:
        flat = p._flat = _simcore.flat_needs(p.preds, p.edge_tensors)  # type: ignore[attr-defined]
    return flat


def _python_flat_needs(p: Problem) -> Flat:
    """``_flat_needs`` in Python, read from the edges as ``needs_of`` reads them without
    building its tuples: the reference of ``_simcore``'s."""
    offsets, producers, numbers, sizes = [0], [], [], []
    ids: dict[object, int] = {}
    edge_tensors = p.edge_tensors
    for pred in p.preds:
        for m, e in pred:
            tensors = edge_tensors[e]
            if not tensors:
                tensors = [(("control", m), 0.0)]
            for key, nbytes in tensors:
                producers.append(m)
                k = ids.get(key)
                if k is None:
                    k = ids[key] = len(ids)
                numbers.append(k)
                sizes.append(nbytes)
        offsets.append(len(producers))
    return offsets, producers, numbers, sizes, list(ids)


def _result(p: Problem, device: list[int], start: list[float], finish: list[float],
            transfers: Transfers, peaks: Peaks
            ) -> SimResult:
    busy = [0.0] * p.num_devices  # the compute streams' (a collective mostly waits on links)
    for w, d, stream in zip(p.w, device, p.stream):
        if not stream:
            busy[d] += w[d]
    work: dict[int, float] = defaultdict(float)
    for d, b in enumerate(busy):
        work[p.cores[d]] += b
    result = SimResult(start, finish, list(device), transfers, busy=busy,
                       reach=max((p.reach[d] for d in set(device)), default=0.0),
                       shared_work=max(work.values(), default=0.0))
    result._peaks = peaks
    return result


def _peaks_of(p: Problem, needs: Needs) -> Peaks:
    """The peaks of memory of a replay of ``p`` by the Python loops (``_peak_memory``)."""
    return lambda r: _peak_memory(p, r, needs)


def _peak_memory(p: Problem, r: SimResult, needs: Needs) -> list[float]:
    live: dict[tuple[object, int], list[float]] = {}  # (tensor, device) -> [alloc, free, bytes]
    for t in r.transfers:  # the sender holds its copy until sent; the receiver from the start
        for d in (t.src, t.dst):
            slot = live.get((t.tensor, d))
            if slot is None:
                live[(t.tensor, d)] = [t.start, t.end, t.nbytes]
            else:
                slot[0], slot[1] = min(slot[0], t.start), max(slot[1], t.end)
    device, start, finish = r.device, r.start, r.finish
    for j in range(p.n):
        dj, fj = device[j], finish[j]
        for m, key, nbytes in needs[j]:
            dm = device[m]
            slot = live.get((key, dm))  # the producer's copy, from its start
            if slot is None:
                slot = live[(key, dm)] = [start[m], finish[m], nbytes]
            else:
                slot[0], slot[1] = min(slot[0], start[m]), max(slot[1], finish[m])
            if dj != dm:
                slot = live[(key, dj)]
            if fj > slot[1]:
                slot[1] = fj
    deltas: list[list[tuple[float, int, float]]] = [[] for _ in range(p.num_devices)]
    for (_, d), (a, b, nbytes) in live.items():
        deltas[d].append((a, 1, nbytes))
        deltas[d].append((b, 0, -nbytes))  # frees sort before allocations at the same time
    base = [0.0] * p.num_devices
    for i, nbytes in enumerate(p.persistent):
        if nbytes:
            base[device[i]] += nbytes
    peaks = []
    for d in range(p.num_devices):
        cur = peak = 0.0
        for _, _, delta in sorted(deltas[d]):
            cur += delta
            peak = max(peak, cur)
        peaks.append(base[d] + peak)
    return peaks
