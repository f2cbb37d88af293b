"""The throughput benchmark's verdict on "slower than the original": the interval of the
median seen ratio decides, and a spread wider than the margin cannot."""
import pytest

pytest.importorskip("scipy")

from benchmarks.throughput_agreement import slower_than_original  # noqa: E402


def test_a_loss_is_called_only_where_the_pairs_interval_lies_beyond_the_margin():
    lo, hi, slower = slower_than_original([0.90, 0.91, 0.92, 0.93, 0.94])
    assert slower == "yes" and 0.90 <= lo <= hi <= 0.94
    assert slower_than_original([0.99, 1.00, 1.01, 1.02, 0.98])[2] == "no"
    # wide_cnn's five pairs at 7632876: a median of 0.956, inside the noise
    lo, hi, slower = slower_than_original([1.062, 0.976, 0.842, 0.956, 0.943])
    assert slower == "cannot tell" and lo < 0.97 < hi
    assert slower_than_original([0.95])[2] == "cannot tell"
