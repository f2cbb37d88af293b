"""Pipeline stages: PipeDream's partitioner against a brute-force optimum."""
import itertools
import random

import pytest

from fastt.errors import FasttError
from fastt.sched.pipeline import Stage, partition, stage_time


def brute_force(T, a, w, M, B):
    """The slowest stage of the best pipeline, by trying every cut and every split of the
    machines."""
    N, best = len(T), float("inf")
    for k in range(1, min(N, M) + 1):
        for cuts in itertools.combinations(range(N - 1), k - 1):
            bounds = list(zip((0,) + tuple(c + 1 for c in cuts), cuts + (N - 1,)))
            for reps in itertools.product(range(1, M + 1), repeat=k):
                if sum(reps) != M:
                    continue
                slowest = max(stage_time(sum(T[i:j + 1]), sum(w[i:j + 1]), r, B)
                              for (i, j), r in zip(bounds, reps))
                slowest = max([slowest] + [a[c] / B for c in cuts])
                best = min(best, slowest)
    return best


def value(T, a, w, stages, B):
    return max([stage_time(sum(T[s.first:s.last + 1]), sum(w[s.first:s.last + 1]),
                           s.replicas, B) for s in stages] + [a[s.last] / B for s in stages[:-1]])


@pytest.mark.parametrize("seed", range(60))
def test_the_partition_is_optimal_on_small_chains(seed):
    rnd = random.Random(seed)
    N, M, B = rnd.randint(1, 6), rnd.randint(1, 5), 1e9
    T = [rnd.uniform(0.1, 10) * 1e-3 for _ in range(N)]
    a = [rnd.choice([1e3, 1e6, 5e6, 2e7]) for _ in range(N)]
    w = [rnd.choice([0.0, 1e5, 1e7, 1e8]) for _ in range(N)]
    got, stages = partition(T, a, w, M, B)
    assert got == pytest.approx(brute_force(T, a, w, M, B))
    # the stages are the layers in order, every machine used, and worth what is claimed
    assert stages[0].first == 0 and stages[-1].last == N - 1
    assert all(s.first == t.last + 1 for t, s in zip(stages, stages[1:]))
    assert sum(s.replicas for s in stages) == M
    assert value(T, a, w, stages, B) == pytest.approx(got)


def test_heavy_weights_stay_unreplicated_and_light_compute_is_replicated():
    """A convolutional front (much compute, few weights) and a fully connected back (little
    compute, 400 MB of weights) on 4 devices joined at 1 GB/s: the front is replicated, the
    back is not (its weights would take 1.2 s to synchronise)."""
    B = 1e9
    got, stages = partition([40e-3, 40e-3, 2e-3], [1e6, 1e6, 0.0], [1e6, 1e6, 4e8], 4, B)
    assert stages == [Stage(0, 1, 3), Stage(2, 2, 1)]
    assert got == pytest.approx(80e-3 / 3)


def test_bad_input():
    with pytest.raises(FasttError, match="as many"):
        partition([1.0], [1.0, 2.0], [1.0], 2, 1e9)
    with pytest.raises(FasttError, match="machines >= 1"):
        partition([1.0], [1.0], [1.0], 0, 1e9)
