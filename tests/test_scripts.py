"""The corpus of unchanged TF1-style scripts (``tests/scripts/``), each run as a user would:
without fastt, then with ``FASTT=1 FASTT_DEVICES=cpu:2``. Both exit 0 with the same final loss
and the same printed results; fastt measured at least one strategy and none failed; the
checkpoint fastt's run wrote restores without fastt and holds what the plain run's holds.
fastt runs with ``FASTT_VERIFY=1``: each strategy's first step is checked against the
original graph's, and a difference beyond reassociation would fail it."""
import glob
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import side_by_side

tf = pytest.importorskip("tensorflow")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "tests", "scripts",
                                                                     "*.py")))
# Lines a script prints that must be the same with fastt (results, not timings).
_RESULT = re.compile(r"^(test accuracy|last batch accuracy|batches drawn|global step|"
                     r"restored|random)\b.*", re.M)


# Scripts run with settings of their own: the wide MLP on devices told to hold 60 MB, less than
# its weights and Adam's slots (106 MiB by fastt's memory model): data parallelism does not
# fit, the original graph does not either, a model-parallel plan does and is kept.
SETTINGS = {"wide_mlp_adam.py": {"FASTT_DEVICE_MEMORY_MB": "60"}}


def run(script, out, fastt, dump=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTT") and k != "TF_CONFIG"}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
    if fastt:  # short runs (200 steps at most): decisions on 3 settled steps, not 20, at
        # any cost
        env.update(FASTT="1", FASTT_DEVICES="cpu:2", FASTT_DUMP_DIR=str(dump), FASTT_OVERHEAD="off",
                   FASTT_CACHE="0",
                   FASTT_MEASURE_STEPS="3", FASTT_WARMUP_STEPS="2",
                   FASTT_MEASURE_SECONDS="0", FASTT_VERIFY="1", **SETTINGS.get(script, {}))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "scripts", script),
                        "--out", str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


# Lines a script prints as it trains (step, iteration or epoch): compared number by number,
# within reassociation of sums (a strategy adds in another order) and the printed digits.
_STEP = re.compile(r"^(?:step|iter|epoch) \d+\b.*$", re.M)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def _same_steps(plain, with_fastt):
    a, b = _STEP.findall(plain), _STEP.findall(with_fastt)
    assert len(a) == len(b), (a, b)
    for x, y in zip(a, b):
        nx, ny = _NUMBER.findall(x), _NUMBER.findall(y)
        assert _NUMBER.sub("#", x) == _NUMBER.sub("#", y) and len(nx) == len(ny), (x, y)
        assert [float(v) for v in ny] == pytest.approx([float(v) for v in nx], rel=1e-3,
                                                       abs=2e-5), (x, y)


def _value(text, key):
    m = re.search(rf"^{key}:? (\S+)$", text, re.M)
    assert m, f"no '{key}' line in:\n{text[-2000:]}"
    return m.group(1)


def _checkpoint(path):
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name, _ in tf.train.list_variables(path)}


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_trains_the_same_with_fastt(script, tmp_path):
    plain, with_fastt = side_by_side(
        lambda: run(script, tmp_path / "plain", fastt=False),
        lambda: run(script, tmp_path / "fastt", fastt=True, dump=tmp_path / "dump"))
    assert float(_value(with_fastt.stdout, "final loss")) == pytest.approx(
        float(_value(plain.stdout, "final loss")), rel=1e-3)
    assert _RESULT.findall(with_fastt.stdout) == _RESULT.findall(plain.stdout)
    _same_steps(plain.stdout, with_fastt.stdout)
    docs = [json.loads(open(p).read()) for p in
            glob.glob(str(tmp_path / "dump" / "strategy-*" / "strategy.json"))]
    statuses = {d["status"] for d in docs}
    # a strategy trained and was measured (a short run may close before the A-B-A decision)
    assert any(d["status"] != "unfinished" or d["measured_step_times_s"] for d in docs if
               d["status"] != "failed"), with_fastt.stderr[-3000:]
    assert "failed" not in statuses, [d["reason"] for d in docs]
    # each strategy's first step verified, but where it runs the script's Python (py_func)
    assert "within reassociation" in with_fastt.stderr or \
        "not verified: it runs the script's Python" in with_fastt.stderr, \
        with_fastt.stderr[-3000:]
    assert "fastt: could not" not in with_fastt.stderr, with_fastt.stderr[-3000:]
    if "FASTT_DEVICE_MEMORY_MB" in SETTINGS.get(script, {}):
        first = min(docs, key=lambda d: d["n"])
        assert first["strategy"] != "data-parallel" and first["status"] in ("active",
                                                                            "superseded")
        assert "a data-parallel replica does not fit" in with_fastt.stderr
        assert len(set(first["placement"].values())) == 2  # spread over both devices
        if "slower" in first["reason"] or "not significantly faster" in first["reason"]:
            assert "kept: the original graph would hold" in first["reason"], first["reason"]
    mine = _checkpoint(_value(with_fastt.stdout, "checkpoint"))
    reference = _checkpoint(_value(plain.stdout, "checkpoint"))
    assert sorted(mine) == sorted(reference)
    for name, value in reference.items():
        if np.asarray(value).dtype.kind in "SUO":  # the object graph of a TF2-format checkpoint
            assert mine[name] == value, name
        else:
            np.testing.assert_allclose(mine[name], value, rtol=2e-3, atol=2e-4, err_msg=name)

