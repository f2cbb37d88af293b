"""The steady-state detector on warm-up series like those recorded, and the decision rule on
synthetic samples (no timings are measured here)."""
import numpy as np
import pytest

from fastt.plugin.measure import (CAP, block_length, compare, mser5_truncation, settled,
                                  steady_start)


def _warmup_then_steady(rng, steady=0.060, noise=0.05, n=120):
    """A script's steps as recorded without fastt: 431, 182, 130, 105, 95 ms, then a slow
    decline to about 60 ms by step 40, then steady with multiplicative noise."""
    head = [0.431, 0.182, 0.130, 0.105, 0.095]
    decline = list(np.linspace(0.090, steady, 35))
    times = head + decline + [steady] * (n - 40)
    return list(np.asarray(times) * rng.lognormal(0.0, noise, n))


def test_the_warm_up_ends_where_the_steps_settle_not_after_a_fixed_count():
    rng = np.random.default_rng(1)
    times = _warmup_then_steady(rng)
    d = mser5_truncation(times)
    assert 25 <= d <= 45
    assert settled(times[:20], min_steps=10) is None  # still declining
    start = settled(times, min_steps=30)
    assert start is not None and 25 <= start <= 45
    assert np.median(times[start:]) == pytest.approx(0.060, rel=0.05)


def test_a_series_steady_from_the_start_is_settled_at_once():
    rng = np.random.default_rng(2)
    times = list(0.02 * rng.lognormal(0.0, 0.1, 40))
    assert settled(times, min_steps=20) is not None and settled(times, min_steps=20) <= 10


def test_a_late_jump_is_not_steady():
    times = [0.05] * 35 + [0.10] * 25
    assert settled(times, min_steps=10) is None  # the change lies past the middle
    assert settled(times + [0.10] * 40, min_steps=10) == 35


def test_a_sample_starts_where_the_steps_settle_or_at_the_cap_marked_unsettled():
    rng = np.random.default_rng(1)
    times = _warmup_then_steady(rng)
    assert steady_start(times[:24], warmup=5, need=20) is None  # too few steps
    start, ok = steady_start(times, warmup=5, need=20)
    assert ok and start == settled(times, 20) and 25 <= start <= 45
    # a level that keeps moving never settles: the last 20 steps, once the cap is reached
    moving = list(np.linspace(0.05, 0.10, 5 + CAP * 20))
    assert steady_start(moving[:-1], warmup=5, need=20) is None
    assert steady_start(moving, warmup=5, need=20) == (5 + (CAP - 1) * 20, False)


@pytest.mark.parametrize("gain,expected", [(0.02, "undecided"), (0.20, "faster"),
                                           (-0.20, "slower")])
def test_two_percent_in_ten_percent_noise_is_not_significant_twenty_is(gain, expected):
    verdicts = []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        base = 0.050 * rng.lognormal(0.0, 0.10, 30)
        cand = 0.050 * (1 - gain) * rng.lognormal(0.0, 0.10, 30)
        verdicts.append(compare(list(base), list(cand)).verdict)
    assert verdicts.count(expected) >= 17, verdicts


def test_a_load_change_between_the_samples_asks_for_new_ones():
    base, cand = [0.05] * 10, [0.03] * 10
    assert compare(base, cand).verdict == "faster"
    v = compare(base, cand, load_change=-0.5)  # the candidate ran on a quieter machine
    assert v.verdict == "load changed" and "-0.50" in v.reason
    v = compare(cand, base, load_change=0.5)  # slower, on a busier machine
    assert v.verdict == "load changed" and "+0.50" in v.reason


def test_a_verdict_the_load_change_worked_against_stands():
    """Faster while the machine got busier (or slower while it got quieter): the load only
    narrowed the gap, so a win measured on a busy machine is kept."""
    base, cand = [0.05] * 10, [0.03] * 10
    v = compare(base, cand, load_change=0.5)
    assert v.verdict == "faster" and "against it" in v.reason
    v = compare(cand, base, load_change=-0.5)
    assert v.verdict == "slower" and "against it" in v.reason
    assert compare(base, base, load_change=0.5).verdict == "load changed"  # undecided


def test_the_verdict_is_reproducible_and_too_few_samples_are_refused():
    rng = np.random.default_rng(3)
    a, b = list(rng.random(12)), list(rng.random(12))
    assert compare(a, b) == compare(a, b)
    with pytest.raises(ValueError, match="at least 3"):
        compare([1.0, 2.0], [1.0, 2.0, 3.0])


def _ar1(seed, n, phi, sd=0.10):
    """Step times whose log follows an AR(1) process: a machine that slows down for a while,
    not for one step (``phi``: the correlation of one step with the next)."""
    rng = np.random.default_rng(seed)
    x = np.empty(n)
    x[0] = rng.normal(0.0, sd)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + rng.normal(0.0, sd * np.sqrt(1 - phi ** 2))
    return 0.050 * np.exp(x)


def test_blocks_follow_the_samples_autocorrelation():
    independent = [block_length(_ar1(s, 100, 0.0)) for s in range(20)]
    dependent = [block_length(_ar1(s, 100, 0.8)) for s in range(20)]
    assert np.median(independent) <= 2 and np.median(dependent) >= 5
    assert max(dependent) <= 100 // 3 and block_length(np.full(30, 0.05)) == 1


def test_steps_that_drift_together_do_not_make_a_difference_significant():
    # no difference, steps correlated as a machine's slow spells make them: resampling steps
    # one by one calls about half of these faster or slower (24 of 50 measured)
    verdicts = [compare(list(_ar1(s, 100, 0.8)), list(_ar1(1000 + s, 100, 0.8)), seed=s).verdict
                for s in range(50)]
    assert sum(v != "undecided" for v in verdicts) <= 8, verdicts
