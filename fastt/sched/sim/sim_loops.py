"""The simulator's event loops in Python (``fastt.sched.sim.simulate``): the reference that the
compiled loops (``_simcore.c``) match event for event, and what runs where they were not
built. ``ordered_loop`` runs each device's ops in a given order, ``fifo_loop`` first come,
first served (or by priority); both return each op's start and finish, the transfers, and
the tensors each op needs.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence

from fastt.sched.sim.problem import TRANSFER_STREAM, Problem

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


def needs_of(p: Problem) -> Needs:
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


def ordered_loop(p: Problem, device: list[int], orders: list[list[int]],
                 link_concurrency: int | None, serve_from: Sequence[float] | None = None
                 ) -> tuple[list[float], list[float], list[Transfer], Needs]:
    """``simulate``'s loop in Python: the reference of ``_simcore``."""
    n, D = p.n, p.num_devices
    needs, wanted = _tensors(p, device)
    start, finish = [0.0] * n, [-1.0] * n
    links = _Links(p, link_concurrency, serve_from)
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


def fifo_loop(p: Problem, device: list[int], link_concurrency: int | None,
              priority: Sequence[float] | None, serve_from: Sequence[float] | None = None
              ) -> tuple[list[float], list[float], list[Transfer], Needs]:
    """``simulate_fifo``'s loop in Python: the reference of ``_simcore``."""
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
    links = _Links(p, link_concurrency, serve_from)
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
    return start, finish, links.transfers, needs


def _tensors(p: Problem, device: list[int]) -> tuple[Needs, list[dict[tuple[object, int],
                                                                       float]]]:
    """Tensors each op needs (``needs_of``), and what each producer must send:
    producer -> {(key, destination device): bytes}, once per device (receivers cache)."""
    needs = needs_of(p)
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
    """Transfers over the links, ``concurrency`` at a time per direction (None: no limit);
    none leaves device ``d`` before ``serve_from[d]`` (``simulate.serve_from``)."""

    def __init__(self, p: Problem, concurrency: int | None,
                 serve_from: Sequence[float] | None = None) -> None:
        self.p, self.concurrency = p, concurrency
        self.serve_from = list(serve_from) if serve_from is not None else [0.0] * p.num_devices
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
        t = max(t, self.serve_from[src])
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
