"""TensorFlow's BFC allocator (best-fit with coalescing), replayed on a step's tensors: the
bytes it holds in use are the sizes of the chunks it hands out, not of the tensors asked for.

Its rules, as ``tensorflow/core/common_runtime/bfc_allocator.cc`` states them: a request is
rounded up to a multiple of 256 bytes and served from the smallest free chunk that holds it
(the lowest address among equals); that chunk is split only when it is at least twice the
request or would waste 128 MiB or more, else the whole chunk is handed out; a freed chunk
merges with its free neighbours in its region; when no free chunk holds a request, a new
region is allocated, each twice the size of the one before (from 2 MiB, at least the request).
"""
from __future__ import annotations

import bisect
from typing import Sequence

ALIGN = 256
MAX_INTERNAL_FRAGMENTATION = 128 << 20
FIRST_REGION = 2 << 20


class BFC:
    """The allocator's chunks, free and in use, and the peak of the bytes in use."""

    def __init__(self) -> None:
        self.free: list[tuple[int, int]] = []  # (size, address), in order
        # address -> [size, in use, previous chunk's address or -1, next chunk's or -1]
        self.chunks: dict[int, list[int]] = {}
        self.region_bytes, self.end = FIRST_REGION, 0
        self.in_use = self.peak = 0

    def allocate(self, nbytes: float) -> int:
        """The address of the chunk handed out for ``nbytes``."""
        rounded = max(ALIGN, -(-int(nbytes) // ALIGN) * ALIGN)
        k = bisect.bisect_left(self.free, (rounded, -1))
        if k == len(self.free):
            self._extend(rounded)
            k = bisect.bisect_left(self.free, (rounded, -1))
        size, a = self.free.pop(k)
        c = self.chunks[a]
        if size >= 2 * rounded or size - rounded >= MAX_INTERNAL_FRAGMENTATION:
            rest = a + rounded
            self.chunks[rest] = [size - rounded, 0, a, c[3]]
            if c[3] >= 0:
                self.chunks[c[3]][2] = rest
            c[0], c[3] = rounded, rest
            bisect.insort(self.free, (size - rounded, rest))
        c[1] = 1
        self.in_use += c[0]
        self.peak = max(self.peak, self.in_use)
        return a

    def release(self, a: int) -> None:
        """Free the chunk at address ``a``, merged with its free neighbours."""
        c = self.chunks[a]
        c[1] = 0
        self.in_use -= c[0]
        if c[3] >= 0 and not self.chunks[c[3]][1]:
            self._merge(a, c[3])
        if c[2] >= 0 and not self.chunks[c[2]][1]:
            a = self._merge(c[2], a)
        bisect.insort(self.free, (self.chunks[a][0], a))

    def _merge(self, a: int, b: int) -> int:
        """Chunk ``b`` (free, not listed as free if it is the one released) merged into the
        chunk ``a`` before it."""
        ca, cb = self.chunks[a], self.chunks.pop(b)
        for x, c in ((a, ca), (b, cb)):
            i = bisect.bisect_left(self.free, (c[0], x))
            if i < len(self.free) and self.free[i] == (c[0], x):
                self.free.pop(i)
        ca[0] += cb[0]
        ca[3] = cb[3]
        if cb[3] >= 0:
            self.chunks[cb[3]][2] = a
        return a

    def _extend(self, rounded: int) -> None:
        while rounded > self.region_bytes:
            self.region_bytes *= 2
        a, size = self.end, self.region_bytes
        self.end += size + ALIGN  # regions are never contiguous: chunks do not merge across
        self.region_bytes *= 2
        self.chunks[a] = [size, 0, -1, -1]
        bisect.insort(self.free, (size, a))


def peak_bytes_in_use(persistent: Sequence[float], tensors: Sequence[tuple[int, int, float]],
                      swaps: Sequence[tuple[int, int]] = (), steps: int = 3) -> int:
    """The allocator's peak of bytes in use when the ``persistent`` buffers (the variables)
    are allocated first and then ``steps`` steps run, each allocating every tensor of
    ``tensors`` (begin, end, bytes: live over [begin, end); frees before allocations at the
    same time). ``swaps`` (time, k): a write at that time gives persistent buffer k a new
    buffer of its size, the old one freed when the write is done."""
    bfc = BFC()
    buffers = {k: bfc.allocate(nbytes) for k, nbytes in enumerate(persistent) if nbytes > 0}
    events = sorted([(b, 1, k) for k, (b, _, _) in enumerate(tensors)] +
                    [(e, 0, k) for k, (_, e, _) in enumerate(tensors)] +
                    [(t, 1, -1 - s) for s, (t, _) in enumerate(swaps)] +
                    [(t + 1, 0, -1 - s) for s, (t, _) in enumerate(swaps)])
    for _ in range(steps):
        held: dict[int, int] = {}
        for _, alloc, k in events:
            if k >= 0:
                if alloc:
                    held[k] = bfc.allocate(tensors[k][2])
                else:
                    bfc.release(held.pop(k))
                continue
            var = swaps[-1 - k][1]
            if var not in buffers:
                continue
            if alloc:
                held[k] = bfc.allocate(persistent[var])
            else:
                bfc.release(buffers[var])
                buffers[var] = held.pop(k)
    return bfc.peak
