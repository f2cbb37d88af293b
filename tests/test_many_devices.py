"""Planning over many devices: more than ``MAX_DEVICES`` is refused in one error line naming
--devices, before anything is built; 64 devices plan to the end (a time limit only guards
against a hang, the wall times are not asserted)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastt.cli import main
from fastt.errors import FasttError
from fastt.sched.sim import device_spec
from fastt.sched.sim.device_spec import MAX_DEVICES, parse

ROOT = Path(__file__).resolve().parents[1]
HANG_S = 300  # a guard against a hang, not a timing


@pytest.mark.parametrize("spec", [f"{MAX_DEVICES}xV100", f"2x{MAX_DEVICES // 2}xV100"])
def test_up_to_the_cap_the_devices_are_parsed(spec):
    ds = parse(spec)
    assert len(ds.devices) == MAX_DEVICES
    assert len(ds.links) == MAX_DEVICES * (MAX_DEVICES - 1)


@pytest.mark.parametrize("spec, count", [(f"{MAX_DEVICES + 1}xV100", MAX_DEVICES + 1),
                                         ("2x40xV100", 80), ("10000xV100", 10000),
                                         ("100000000xV100", 100000000)])
def test_past_the_cap_the_spec_is_refused_before_the_devices_are_built(spec, count,
                                                                       monkeypatch):
    monkeypatch.setattr(device_spec, "Device", None)  # nothing may be built
    with pytest.raises(FasttError) as e:
        parse(spec)
    assert str(e.value).startswith(f"--devices {spec!r}: {count} devices, more than the "
                                   f"{MAX_DEVICES} ")


def test_a_device_file_past_the_cap_is_refused(tmp_path):
    path = tmp_path / "devices.json"
    path.write_text(json.dumps({"devices": [{"name": f"/gpu:{k}"}
                                            for k in range(MAX_DEVICES + 1)]}))
    with pytest.raises(FasttError, match=f"{MAX_DEVICES + 1} devices, more than the "
                                         f"{MAX_DEVICES} "):
        parse(str(path))


def test_the_cap_ends_fastt_plan_in_one_error_line(capsys):
    code = main(["plan", "--model", "small_cnn", "--devices", "10000xV100", "--budget", "10"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.splitlines() == [
        f"fastt: error: --devices '10000xV100': 10000 devices, more than the {MAX_DEVICES} "
        "fastt plans over (its data-parallel and all-reduce graphs grow with the devices, "
        "the links with their square)"]


_SMALL = """
import sys
from fastt import plan_cmd
from fastt.cli import main
from tests.helpers import training_graph
from tests.helpers import costs
plan_cmd.load = lambda *args: training_graph(B=128)
plan_cmd.cost_source = lambda g, ds, *args: costs(ds, g)
sys.exit(main(["plan", "--model", "small_cnn", "--fetch", "update", "--fetch", "loss",
               "--devices", "64xV100", "--budget", "30"]))
"""


def _plan(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2",
           "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=HANG_S, stdin=subprocess.DEVNULL)


def test_a_training_graph_plans_over_64_devices():
    """Every strategy over 64 devices (the data-parallel ones with 64 replicas), without
    TensorFlow; each step it takes said on stderr."""
    p = _plan(["-c", _SMALL])
    assert p.returncode == 0, p.stderr
    assert "devices 64xV100 (64)" in p.stdout
    assert "data-parallel  " in p.stdout and "not computed" not in p.stdout.split(
        "data-parallel  ")[1].splitlines()[0]
    assert "placing and replaying" in p.stderr and "planning os-dpos (its search)" in p.stderr


def test_a_zoo_model_plans_over_64_devices():
    """vgg_like with a batch every device gets a share of: 64 replicas."""
    pytest.importorskip("tensorflow")
    p = _plan(["-m", "fastt.cli", "plan", "--model", "vgg_like", "--batch-size", "128",
               "--devices", "64xV100"])
    assert p.returncode == 0, p.stderr
    assert "devices 64xV100 (64)" in p.stdout and "os-dpos *" in p.stdout
