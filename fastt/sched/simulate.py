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

import glob
import heapq
import importlib.util
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable, Sequence

from fastt.errors import FasttError
from fastt.sched.problem import TRANSFER_STREAM, Problem



def _load_simcore() -> ModuleType | None:
    """The compiled loop (``_simcore.c``, built by ``pip install``), from this package or,
    when it runs from a checkout, from where it was installed; None where it was not built
    (no C compiler at install): the Python loop then runs."""
    try:
        from fastt.sched import _simcore  # type: ignore[attr-defined]
        return _simcore
    except ImportError:
        pass
    for d in sys.path:
        for path in sorted(glob.glob(os.path.join(d or os.curdir, "fastt", "sched",
                                                  "_simcore*.so"))):
            spec = importlib.util.spec_from_file_location("fastt.sched._simcore", path)
            if spec and spec.loader:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                return module
    return None


_simcore = _load_simcore()

Needs = list[list[tuple[int, object, float]]]  # per op: (producer, tensor key, bytes)
SMALL_BYTES = 64 * 1024


@dataclass
class Transfer:
    tensor: object
    src: int
    dst: int
    nbytes: float
    start: float
    end: float


@dataclass
class SimResult:
    start: list[float]
    finish: list[float]
    device: list[int]
    transfers: list[Transfer] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    reach: float = 0.0  # what the step pays to run on the devices it uses (Problem.reach)
    shared_work: float = 0.0  # the busiest cores' work over the devices sharing them
    # the per-device peaks of live bytes, worked out when first read (most replays never do)
    _peaks: Callable[[], list[float]] | None = field(default=None, repr=False)
    _peak_memory: list[float] | None = field(default=None, repr=False)

    @property
    def peak_memory(self) -> list[float]:
        """Per device, the peak bytes held: variables plus live tensors."""
        if self._peak_memory is None:
            self._peak_memory = self._peaks() if self._peaks else []
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
    if sorted(i for o in orders for i in o) != list(range(n)):
        raise FasttError("the device orders must list every op exactly once")
    for d, order in enumerate(orders):
        for i in order:
            if device[i] != d:
                raise FasttError(f"op {p.names[i]!r} is in device {d}'s order but placed on "
                                 f"device {device[i]}")
    if _simcore is not None and compiled:
        start, finish, transfers = _compiled(_simcore, p, device, orders, link_concurrency)
        needs = None  # built when the peaks of memory are read
    else:
        start, finish, transfers, needs = _simulate(p, device, orders, link_concurrency)
    if any(f < 0 for f in finish):
        stuck = [p.names[i] for i in range(n) if finish[i] < 0][:5]
        raise FasttError(f"the orders deadlock (an op waits for one ordered after it): {stuck}")
    return _result(p, device, start, finish, transfers, needs)


def _compiled(core: ModuleType, p: Problem, device: list[int], orders: list[list[int]] | None,
              link_concurrency: int | None, priority: Sequence[float] | None = None
              ) -> tuple[list[float], list[float], list[Transfer]]:
    """``simulate``'s loop (``orders`` None: ``simulate_fifo``'s) in ``core`` (``_simcore``:
    the same events, the same arithmetic)."""
    flat = _flat_needs(p)
    w = p.w
    start, finish, (key, src, dst, nbytes, begin, end) = core.simulate(
        p.num_devices, device, [w[j][d] for j, d in enumerate(device)], p.stream, orders,
        *flat[:4], p.intercept, p.slope, p.knee, p.extra, p.least_knee, p.send_cpu,
        p.recv_cpu, [x for row in p.call_cpu for calls in row for x in calls], TRANSFER_STREAM,
        -1 if link_concurrency is None else link_concurrency, SMALL_BYTES, priority)
    keys = flat[4]
    return start, finish, [Transfer(keys[k], a, b, x, t0, t1) for k, a, b, x, t0, t1
                           in zip(key, src, dst, nbytes, begin, end)]


def _simulate(p: Problem, device: list[int], orders: list[list[int]],
              link_concurrency: int | None
              ) -> tuple[list[float], list[float], list[Transfer], Needs]:
    """``simulate``'s loop in Python: the reference of ``_simcore``."""
    n, D = p.n, p.num_devices
    needs, wanted = _tensors(p, device)
    start, finish = [0.0] * n, [-1.0] * n
    links = _Links(p, link_concurrency)
    streams = max(p.stream, default=0) + 1
    lanes: list[list[list[int]]] = [[[] for _ in range(streams)] for _ in orders]
    unordered = [s == TRANSFER_STREAM for s in p.stream]  # run as soon as they can
    for d, order in enumerate(orders):  # per device, per stream: its ops in order
        for i in order:
            if not unordered[i]:
                lanes[d][p.stream[i]].append(i)
    waiting = [len({m for m, _, _ in needs[j]}) if unordered[j] else 0 for j in range(n)]
    gates: list[list[int]] = [[] for _ in range(n)]  # producer -> unordered ops it feeds
    for j in range(n):
        if unordered[j]:
            for m in {m for m, _, _ in needs[j]}:
                gates[m].append(j)
    # An op's inputs become known one by one: a producer on its device once that producer
    # has started (its finish is then known), one on another device once it has sent.
    unknown = [len(nd) for nd in needs]
    local: list[list[int]] = [[] for _ in range(n)]  # producer -> consumers on its device
    remote: list[list[int]] = [[] for _ in range(n)]  # ... and on others, once per need
    for j in range(n):
        for m, _, _ in needs[j]:
            (local if device[m] == device[j] else remote)[m].append(j)
    pos = [[0] * streams for _ in range(D)]
    stream_free = [[0.0] * D for _ in range(streams)]  # per stream, per device
    dev_free = stream_free[0]  # the compute streams
    events: list[tuple[float, int]] = []  # (finish time, op)
    # Devices whose next op in some stream has all its inputs known: only they can start
    # anything at an event (the others would find their next ops waiting).
    armed: set[int] = set()

    def known(consumers: list[int]) -> None:
        for j in consumers:
            unknown[j] -= 1
            if not unknown[j] and not unordered[j]:
                d, s = device[j], p.stream[j]
                lane = lanes[d][s]
                if pos[d][s] < len(lane) and lane[pos[d][s]] == j:
                    armed.add(d)

    def inputs_ready(j: int, d: int) -> float:
        """When op j's inputs are all on device d (all known)."""
        t = 0.0
        for m, key, _ in needs[j]:
            t = max(t, finish[m] if device[m] == d else links.arrival[(key, d)])
        return t

    def started(j: int, t: float) -> None:
        start[j], finish[j] = t, t + p.w[j][device[j]]
        heapq.heappush(events, (finish[j], j))
        known(local[j])

    def try_start(d: int) -> None:
        for s, lane in enumerate(lanes[d]):
            free = stream_free[s]
            while pos[d][s] < len(lane):
                j = lane[pos[d][s]]
                if unknown[j]:
                    break
                t = max(free[d], inputs_ready(j, d))
                if s == 0:
                    t = links.absorb(d, t, dev_free)
                pos[d][s] += 1
                started(j, t)
                free[d] = finish[j]
                if p.w[j][d] > 0:
                    break  # the stream is busy until that op's finish event
        if any(pos[d][s] < len(lane) and not unknown[lane[pos[d][s]]]
               for s, lane in enumerate(lanes[d])):
            armed.add(d)
        else:
            armed.discard(d)

    def run_unordered(j: int) -> None:
        started(j, inputs_ready(j, device[j]))

    for j in range(n):
        if unordered[j] and not waiting[j]:
            run_unordered(j)
    for d in range(D):
        try_start(d)
    while events:
        t, m = heapq.heappop(events)
        links.send(m, device[m], t, wanted[m])
        known(remote[m])
        for j in gates[m]:
            waiting[j] -= 1
            if not waiting[j]:
                run_unordered(j)
        for d in sorted(armed):
            try_start(d)
    return start, finish, links.transfers, needs


def simulate_fifo(p: Problem, device: list[int], link_concurrency: int | None = 1,
                  priority: Sequence[float] | None = None, compiled: bool = True) -> SimResult:
    """Simulate ``p`` with op ``i`` on ``device[i]`` and no enforced order: like TensorFlow's
    own executor, each device runs its ready ops first come, first served (ties by op
    index: graph order); with ``priority``, the ready op of highest priority first (a
    priority executor). O((n + e) log n) for n ops and e edges. Compiled as ``simulate``."""
    if _simcore is not None and compiled:
        start, finish, transfers = _compiled(_simcore, p, device, None, link_concurrency,
                                             priority)
        return _result(p, device, start, finish, transfers)
    n, D = p.n, p.num_devices
    needs, wanted = _tensors(p, device)
    # per producer, its consumers and the tensor each needs (None: on the producer's device)
    consumers: list[list[tuple[int, object]]] = [[] for _ in range(n)]
    for j in range(n):
        for m, key, _ in needs[j]:
            consumers[m].append((j, None if device[m] == device[j] else key))
    pending = [len(nd) for nd in needs]
    ready_at = [0.0] * n
    start, finish = [0.0] * n, [-1.0] * n
    links = _Links(p, link_concurrency)
    charges, arrival = links._charges, links.arrival
    lane = [device[j] + D * p.stream[j] for j in range(n)]  # stream s of device d: d + D * s
    lanes = D * (max(p.stream, default=0) + 1)
    waiting: list[list[tuple[float, int]]] = [[] for _ in range(lanes)]  # (ready time, op)
    ready: list[list[tuple[float, int]]] = [[] for _ in range(lanes)]  # (key, op), ready now
    busy_until = [0.0] * lanes
    events: list[tuple[float, int, int]] = []  # (time, 0: op finishes / 1: lane looks, x)
    push, pop = heapq.heappush, heapq.heappop

    def becomes_ready(j: int, t: float) -> None:
        x = lane[j]
        push(waiting[x], (t, j))
        if busy_until[x] <= t:  # (a busy lane looks when its op finishes)
            push(events, (t, 1, x))

    for j in range(n):
        if not pending[j]:
            becomes_ready(j, 0.0)
    while events:
        t, kind, x = pop(events)
        if kind == 1:
            queue = waiting[x]
            while queue and queue[0][0] <= t:
                at, j = pop(queue)
                push(ready[x], (at if priority is None else -priority[j], j))
            if busy_until[x] > t or not ready[x]:
                continue  # busy (it looks again when its op finishes) or nothing ready yet
            if x < D and charges[x] and links.absorb(x, t, busy_until) > t:
                push(events, (busy_until[x], 1, x))  # moving bytes first
                continue
            _, j = pop(ready[x])
            start[j], finish[j] = t, t + p.w[j][device[j]]
            busy_until[x] = finish[j]
            push(events, (finish[j], 0, j))
            continue
        m = x
        if wanted[m]:
            links.send(m, device[m], t, wanted[m])
        push(events, (t, 1, lane[m]))
        for j, key in consumers[m]:
            a = t if key is None else arrival[(key, device[j])]
            if a > ready_at[j]:
                ready_at[j] = a
            pending[j] -= 1
            if not pending[j]:
                becomes_ready(j, ready_at[j])
    return _result(p, device, start, finish, links.transfers, needs)


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


def _needs(p: Problem) -> Needs:
    """Tensors each op needs, (producer, key, bytes): the same for every placement, built
    once per problem."""
    needs: Needs | None = getattr(p, "_needs", None)
    if needs is None:
        needs = [[] for _ in range(p.n)]
        for j in range(p.n):
            for m, e in p.preds[j]:
                for key, nbytes in p.edge_tensors[e] or [(("control", m), 0.0)]:
                    needs[j].append((m, key, nbytes))
        p._needs = needs  # type: ignore[attr-defined]
    return needs


Flat = tuple[list[int], list[int], list[int], list[float], list[object]]


def _flat_needs(p: Problem) -> Flat:
    """``_needs`` as ``_simcore`` reads them: each op's first need's offset (and the end),
    the needs' producers, key numbers and bytes; and the keys by number. Once per problem."""
    flat: Flat | None = getattr(p, "_flat", None)
    if flat is None:  # read from the edges as _needs does, without building its tuples
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
        flat = p._flat = (offsets, producers, numbers, sizes,  # type: ignore[attr-defined]
                          list(ids))
    return flat


def _tensors(p: Problem, device: list[int]) -> tuple[Needs, list[dict[tuple[object, int],
                                                                       float]]]:
    """Tensors each op needs (``_needs``), and what each producer must send:
    producer -> {(key, destination device): bytes}, once per device (receivers cache)."""
    needs = _needs(p)
    wanted: list[dict[tuple[object, int], float]] = [{} for _ in range(p.n)]
    for j, nd in enumerate(needs):
        dj = device[j]
        for m, key, nbytes in nd:
            if device[m] != dj:
                wanted[m][(key, dj)] = nbytes
    return needs, wanted


class _InFlight:
    """Per device, until when it is moving transfers. A transfer asked for while its end moves
    another is part of a burst: gRPC's threads serve several calls a wake-up, and a call then
    costs that end less than alone (``Problem.call_cpu``)."""

    def __init__(self) -> None:
        self._until: dict[int, float] = {}

    def lone(self, end: int, start: float, finish: float) -> bool:
        """Whether a transfer asked for at ``start`` (ready to move; it may wait for its link)
        and done at ``finish`` finds ``end`` moving nothing; records it (transfers in order of
        ``start``)."""
        was = self._until.get(end)
        self._until[end] = finish if was is None else max(was, finish)
        return was is None or start >= was


class _Links:
    """Transfers over the links, ``concurrency`` at a time per direction (None: no limit)."""

    def __init__(self, p: Problem, concurrency: int | None) -> None:
        self.p, self.concurrency = p, concurrency
        self.arrival: dict[tuple[object, int], float] = {}
        self.transfers: list[Transfer] = []
        self._free: dict[tuple[int, int, bool], list[float]] = {}  # (src, dst, small)
        self._charges: list[list[tuple[float, float]]] = [[] for _ in range(p.num_devices)]
        self.moving = _InFlight()  # which ends move transfers: a call in a burst costs less

    def absorb(self, d: int, t: float, free: list[float]) -> float:
        """When device ``d`` can start an op ready at ``t``, once it has done its share of the
        transfers that started by then (``free[d]``: when it is done with what it ran)."""
        q = self._charges[d]
        while q and q[0][0] <= t:
            begin, seconds = heapq.heappop(q)
            free[d] = max(free[d], begin) + seconds
            t = max(t, free[d])
        return t

    def send(self, m: int, src: int, t: float, wanted: dict[tuple[object, int], float]) -> None:
        """Send what producer ``m`` (on ``src``, finished at ``t``) owes other devices."""
        if not wanted:
            return
        p = self.p
        owed = sorted(wanted.items(), key=lambda kv: kv[0][1]) if len(wanted) > 1 else \
            wanted.items()
        for (key, dst), nbytes in owed:
            latency = p.intercept[src][dst]
            cost = p.transfer(src, dst, nbytes) if nbytes > p.least_knee[src] else \
                latency + p.slope[src][dst] * nbytes
            begin = t
            if self.concurrency is not None:
                lanes = self._free.setdefault((src, dst, nbytes < SMALL_BYTES),
                                              [0.0] * self.concurrency)
                k = min(range(len(lanes)), key=lanes.__getitem__)
                begin = max(t, lanes[k])
                lanes[k] = begin + cost
            self.arrival[(key, dst)] = begin + cost
            calls = p.call_cpu[src][dst]
            shares = (p.send_cpu[src][dst], p.recv_cpu[src][dst])
            if shares[0] or shares[1] or any(calls):  # the cores move the bytes
                copy = cost - latency  # the bandwidth's time
                for end, d in enumerate((src, dst)):
                    work = shares[end] * copy + calls[
                        end + 2 if self.moving.lone(d, t, begin + cost) else end]
                    if work > 0:
                        heapq.heappush(self._charges[d], (begin, work))
            self.transfers.append(Transfer(key, src, dst, nbytes, begin, begin + cost))


def _result(p: Problem, device: list[int], start: list[float], finish: list[float],
            transfers: list[Transfer], needs: Needs | None = None) -> SimResult:
    busy = [0.0] * p.num_devices  # the compute streams' (a collective mostly waits on links)
    for i in range(p.n):
        if not p.stream[i]:
            busy[device[i]] += p.w[i][device[i]]
    work: dict[int, float] = defaultdict(float)
    for d, b in enumerate(busy):
        work[p.cores[d]] += b
    result = SimResult(start, finish, list(device), transfers, busy=busy,
                       reach=max((p.reach[d] for d in set(device)), default=0.0),
                       shared_work=max(work.values(), default=0.0))
    result._peaks = lambda: _peak_memory(p, result, needs or _needs(p))
    return result


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
