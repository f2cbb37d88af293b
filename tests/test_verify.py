"""The per-step check's comparison (no TensorFlow)."""
import math

import numpy as np

from fastt.plugin.verify import Difference, differences, relative, tolerance, verdict


def test_reassociation_is_within_float32_tolerance_and_a_lost_update_is_not():
    rng = np.random.default_rng(0)
    terms = rng.standard_normal((1000, 64)).astype(np.float32)
    forward = terms.sum(axis=0)
    backward = terms[::-1].sum(axis=0)  # the same sum in another order
    assert 0 < relative(forward, backward) <= tolerance(forward) == 1e-4
    w = rng.standard_normal(64).astype(np.float32)
    updated = w - np.float32(0.01) * rng.standard_normal(64).astype(np.float32)
    assert relative(updated, w) > 100 * tolerance(w)


def test_shapes_types_and_nans():
    assert relative(np.zeros(3), np.zeros(4)) == math.inf
    assert relative(np.array([1, 2]), np.array([1, 2])) == 0.0
    assert relative(np.array([1, 2]), np.array([1, 3])) == math.inf  # integers: exact
    assert tolerance(np.array([1, 2])) == 0.0
    assert relative(np.array([np.nan, 1.0]), np.array([np.nan, 1.0])) == 0.0
    assert relative(np.array([np.nan, 1.0]), np.array([0.0, 1.0])) == math.inf


def test_the_verdict_names_the_worst_difference():
    found = differences({"a": np.ones(3, np.float32), "b": np.ones(2, np.float32)},
                        {"a": np.ones(3, np.float32), "b": np.array([1, 2], np.float32)},
                        "variable")
    assert [d.within for d in found] == [True, False]
    line = verdict(found)
    assert line.startswith("the step differs") and "variable b: 1" in line
    assert verdict([Difference("x", "fetch", 0.0, 1e-4)]) == ""
    assert differences({"gone": np.ones(1)}, {}, "fetch")[0].relative == math.inf
