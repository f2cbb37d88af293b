"""The cycle a ring all-reduce runs over: NCCL builds its rings over a server's fastest
links, so the order of the devices in a ring is the topology's, not their numbering."""
from __future__ import annotations

import functools
import itertools
from typing import Iterable, Sequence

# Past this many devices the ring is found greedily ((D-1)! cycles are too many to try).
RING_EXHAUSTIVE = 8


def ring_order(slope: Sequence[Sequence[float]]) -> list[int]:
    """``ring_of`` the matrix of seconds per byte ``slope[a][b]`` (cached: the compiler asks
    for every problem it builds)."""
    return list(_ring(tuple(tuple(row) for row in slope)))


@functools.lru_cache(maxsize=64)
def _ring(slope: tuple[tuple[float, ...], ...]) -> tuple[int, ...]:
    """The devices in the order of the ring all-reduce's cycle (device 0 first): the cycle
    whose slowest link is fastest (then the least total time per byte), as NCCL builds its
    rings over the links a server has (a DGX-1's cube-mesh: NVLink pairs, not PCIe). The
    identity order unless another is strictly better, so uniform links keep replica k on
    device k. Exhaustive up to ``RING_EXHAUSTIVE`` devices (O(D!)), else nearest neighbour
    (O(D^2))."""
    D = len(slope)

    def cost(ring: tuple[int, ...]) -> tuple[float, float]:
        hops = [slope[a][b] for a, b in zip(ring, ring[1:] + ring[:1])]
        return max(hops, default=0.0), sum(hops)

    best = tuple(range(D))
    if D <= 2:
        return best
    if D <= RING_EXHAUSTIVE:
        candidates: Iterable[tuple[int, ...]] = (
            (0, *rest) for rest in itertools.permutations(range(1, D)))
    else:
        path, left = [0], set(range(1, D))
        while left:
            nxt = min(left, key=lambda d: (slope[path[-1]][d], d))
            path.append(nxt)
            left.remove(nxt)
        candidates = (tuple(path),)
    best_cost = cost(best)
    for ring in candidates:
        c = cost(ring)
        if c < best_cost:
            best, best_cost = ring, c
    return best
