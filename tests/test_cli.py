import json
import subprocess
import sys

from fastt import __version__
from fastt.cli import main


def test_version_and_help(capsys):
    try:
        main(["--version"])
    except SystemExit as e:
        assert e.code == 0
    assert __version__ in capsys.readouterr().out
    assert main([]) == 0
    out = capsys.readouterr().out
    assert all(cmd in out for cmd in ("demo", "plan", "worker"))


def test_console_script_demo_runs(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "fastt.cli", "demo", "--out", str(out),
                           "--steps", "3"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "coverage" in proc.stdout and "communication model" in proc.stdout
    data = json.loads((out / "cost_models.json").read_text())
    assert data["schema_version"] == 1 and data["compute"]["samples"]
    assert len(data["comm"]["pairs"]) == 2  # both directions between the two devices
