"""The per-step check's comparison (no TensorFlow)."""
import math
import os

import numpy as np

from fastt.plugin.verify import Difference, differences, relative, tolerance, verdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def _fake(tmp_path, body):
    """A script that appends checks to FASTT_VERIFY_REPORT as the plugin would."""
    script = tmp_path / "fake_train.py"
    script.write_text("import sys\nsys.path.insert(0, %r)\n" % ROOT +
                      "import os, sys\nfrom fastt.plugin.verify import Difference, record\n"
                      "path = os.environ['FASTT_VERIFY_REPORT']\n" + body)
    return str(script)


def test_record_and_read_round_trip(tmp_path):
    from fastt.plugin.verify import read, record
    path = str(tmp_path / "checks.jsonl")
    assert read(path) == []
    record(path, "strategy 1 (data-parallel)", [Difference("w", "variable", 3e-7, 1e-4),
                                                 Difference("n", "fetch", math.inf, 0.0)], step=7)
    record(path, "strategy 2 (os-dpos)", [], "it runs the script's Python (PyFunc)")
    first, second = read(path)
    assert first["step"] == 7 and first["tensors"][1]["relative"] is None  # inf: unequal
    assert "fetch n: inf" in first["verdict"]
    assert second["skipped"].startswith("it runs") and second["verdict"] == ""


def test_the_command_passes_its_settings_and_says_each_check(tmp_path, capsys, monkeypatch):
    from fastt import verify_cmd
    monkeypatch.setenv("FASTT_MEASURE_STEPS", "7")  # the caller's own setting wins
    script = _fake(tmp_path, "assert os.environ['FASTT'] == '1' and "
                   "os.environ['FASTT_DEVICES'] == 'cpu:3' and "
                   "os.environ['FASTT_MEASURE_STEPS'] == '7' and "
                   "os.environ['FASTT_OVERHEAD'] == 'off' and sys.argv[1:] == ['--x', '1']\n"
                   "record(path, 'strategy 1 (os-dpos)', "
                   "[Difference('loss:0', 'fetch', 2e-6, 1e-4)], step=12)\n")
    out = tmp_path / "checks.json"
    assert verify_cmd.run(script, ["--x", "1"], "cpu:3", str(out)) == verify_cmd.EXIT_WITHIN
    said = capsys.readouterr().out
    assert "strategy 1 (os-dpos) at step 12: 1 tensors within reassociation; largest 2e-06 " \
           "at fetch loss:0" in said
    import json
    assert json.loads(out.read_text())["checks"][0]["tensors"][0]["name"] == "loss:0"


def test_the_command_fails_on_a_difference_nothing_checked_or_the_scripts_failure(
        tmp_path, capsys):
    from fastt import verify_cmd
    differs = _fake(tmp_path, "record(path, 's', [Difference('w2', 'variable', 0.01, 1e-4), "
                    "Difference('w1', 'variable', 0.0, 1e-4)])\n")
    assert verify_cmd.run(differs, [], show_all=True) == verify_cmd.EXIT_DIFFERS
    said = capsys.readouterr().out
    assert "2 tensors DIFFER; largest 0.01 at variable w2" in said and "variable w1: 0" in said
    nothing = _fake(tmp_path, "")
    assert verify_cmd.run(nothing, []) == verify_cmd.EXIT_UNCHECKED
    assert "nothing was checked" in capsys.readouterr().out
    failing = _fake(tmp_path, "sys.exit(4)\n")
    assert verify_cmd.run(failing, []) == 4
    assert "exited with 4" in capsys.readouterr().err


def test_a_sum_that_cancels_is_compared_over_its_kind_and_a_lost_small_update_is_not():
    """The Adam slot of an attention key's bias holds rounding noise (its gradient cancels):
    another order of the sum is other noise, within tolerance over the slots' scale. A bias
    whose small update was lost still differs: it is not at the rounding level."""
    rng = np.random.default_rng(1)
    ref = {"q/biases/Adam": rng.standard_normal(8).astype(np.float32) * 1e-3,
           "key/biases/Adam": rng.standard_normal(8).astype(np.float32) * 1e-11,
           "key/biases": np.full(8, 0.02, np.float32)}
    got = dict(ref, **{"key/biases/Adam": rng.standard_normal(8).astype(np.float32) * 1e-11})
    found = {d.name: d for d in differences(ref, got, "variable")}
    assert relative(ref["key/biases/Adam"], got["key/biases/Adam"]) > 0.5  # alone: noise
    assert found["key/biases/Adam"].within and found["key/biases/Adam"].relative < 1e-7
    lost = dict(ref, **{"key/biases": np.full(8, 0.02 + 1e-5, np.float32)})  # lr * grad
    assert not {d.name: d for d in differences(ref, lost, "variable")}["key/biases"].within


def test_a_variable_adam_drives_with_noise_may_end_anywhere_within_its_step():
    """Adam turns the noise gradient of an attention key's bias into learning-rate steps of
    the noise's sign: the two runs' biases differ by up to their steps, and that is allowed
    only for a variable whose slots are at the rounding level, and only within its step."""
    rng = np.random.default_rng(2)
    before = {"key/biases": np.zeros(8, np.float32), "q/biases": np.zeros(8, np.float32)}
    step = np.float32(1e-3) * np.sign(rng.standard_normal(8)).astype(np.float32)
    ref = {"key/biases": step, "key/biases/Adam": step * np.float32(1e-8),
           "q/biases": step, "q/biases/Adam": step * np.float32(1e-1)}
    got = dict(ref, **{"key/biases": -step, "key/biases/Adam": -step * np.float32(1e-8)})
    found = {d.name: d for d in differences(ref, got, "variable", before=before)}
    assert found["key/biases"].within and found["key/biases"].tolerance == 1.0
    beyond = dict(got, **{"key/biases": np.float32(5) * step})  # past either run's step
    assert not {d.name: d for d in differences(ref, beyond, "variable",
                                               before=before)}["key/biases"].within
    flipped = dict(ref, **{"q/biases": -step})  # its slots are not noise: a real difference
    assert not {d.name: d for d in differences(ref, flipped, "variable",
                                               before=before)}["q/biases"].within
