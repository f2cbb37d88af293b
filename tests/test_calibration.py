"""The analytical costs' calibration: the factors file, and each op scaled by its class."""
import json

import pytest

from fastt.costs import calibration
from fastt.errors import FasttError


class Op:
    def __init__(self, name, type_):
        self.name, self.type = name, type_


def test_the_shipped_file_has_v100_factors_and_none_for_other_kinds():
    f = calibration.factors("V100")
    assert f is not None and set(f) == set(calibration.CLASSES)
    assert all(v > 0 for v in f.values())
    assert calibration.factors("A100") is None


def test_each_op_is_scaled_by_its_class():
    ops = [Op("conv", "Conv2DBackpropInput"), Op("mm", "BatchMatMulV2"), Op("relu", "Relu")]
    out = calibration.scaled(ops, {"conv": 1.0, "mm": 2.0, "relu": 3.0, "other": 4.0},
                             {"compute": 0.5, "memory": 2.0})
    assert out == {"conv": 0.5, "mm": 1.0, "relu": 6.0, "other": 8.0}


def test_a_malformed_file_is_named(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"kinds": {"V100": {"factors": {"compute": 1.0}}}}))
    with pytest.raises(FasttError, match="cost calibration .*c.json.*memory"):
        calibration.factors("V100", str(p))
    p.write_text("[]")
    with pytest.raises(FasttError, match="cost calibration"):
        calibration.factors("V100", str(p))
