"""Strategy dumps of a real session (a small model on 2 logical CPU devices, one strategy
rolled back and one activated): every file follows its schema, `fastt inspect` shows both,
and report.html renders in headless Chromium with a Gantt row per device and no script
error."""
import json
import os
import re
import shutil
import subprocess
import time

import pytest

tf = pytest.importorskip("tensorflow")

import fastt.plugin  # noqa: E402
from fastt.cli import main  # noqa: E402
from fastt.inspect import schema  # noqa: E402
from fastt.inspect.summary import MAX_TIMES  # noqa: E402
from fastt.plugin import runtime  # noqa: E402
from tests.plugin_helpers import build, settings, train  # noqa: E402


@pytest.fixture(scope="module")
def dump_dir(tmp_path_factory):
    """The original graph sleeps 20 ms a step, strategy 1 sleeps 60 ms (rolled back),
    strategy 2 none (activated): the outcome does not depend on the machine's speed."""
    root = tmp_path_factory.mktemp("dumps")
    dispatch = runtime.SessionPlugin._dispatch

    def paced(self, *args):
        history = self.controller.history if self.controller else []
        n = next((e.n for e in history if e.strategy is self.current.strategy), 0)
        time.sleep({0: 0.02, 1: 0.06}.get(n, 0.0))  # n = 0: the original graph
        return dispatch(self, *args)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runtime.SessionPlugin, "_dispatch", paced)
        # order=False: no FIFO trial of the kept plan after it (a third, unpaced strategy)
        fastt.plugin.install(settings(root, strict=True, order=False))
        try:
            sess, _, _ = train(build(), steps=160)  # strategy 2 kept after its recheck
            sess.close()
        finally:
            fastt.plugin.uninstall()
    return root


def docs(root):
    return {d: json.loads((root / d / "strategy.json").read_text())
            for d in sorted(os.listdir(root))}


def test_every_dump_file_follows_its_schema(dump_dir):
    found = docs(dump_dir)
    assert [(d["n"], d["status"]) for d in found.values()] == [(1, "rolled_back"),
                                                                (2, "active")]
    for name in found:
        files = sorted(os.listdir(dump_dir / name))
        assert files == ["cost_models.json", "graph.dot", "measured_trace.json",
                         "predicted_trace.json", "report.html", "strategy.json"], files
        for f, kind in schema.FILES.items():
            assert schema.validate(json.loads((dump_dir / name / f).read_text()), kind) == []
    measured = json.loads((dump_dir / "strategy-2" / "measured_trace.json").read_text())
    info = measured["otherData"]["fastt"]
    assert info["kind"] == "measured" and info["devices"][:2] == found["strategy-2"]["devices"]
    # A process per device (pid = its index + 1): every device the strategy placed ops on
    # ran ops in the traced step (OS-DPOS may keep a small model on one device).
    used = set(found["strategy-2"]["placement"].values())
    expected = {info["devices"].index(d) + 1 for d in used}
    assert {e["pid"] for e in measured["traceEvents"] if e.get("cat") == "op"} >= expected
    # Each decision names its verdict and the steps it rests on (step-to-step times).
    verdicts = [(d["decision"]["verdict"], d["decision"]["baseline"]) for d in found.values()]
    assert verdicts == [("slower", "the original graph"), ("faster", "the original graph")]
    assert all(d["decision"]["steps"] == len(d["measured_step_times_s"]) >= 3
               for d in found.values())
    assert min(found["strategy-1"]["measured_step_times_s"]) >= 0.06
    history = found["strategy-2"]["history"]
    assert [(h["dump"], h["status"]) for h in history] == [("strategy-1", "rolled_back"),
                                                           ("strategy-2", "active")]


def test_inspect_shows_the_rolled_back_and_the_active_strategy(dump_dir, capsys):
    assert main(["inspect", str(dump_dir)]) == 0
    out = capsys.readouterr().out
    found = docs(dump_dir)
    for name, status in (("strategy-1", "rolled back"), ("strategy-2", "active")):
        doc = found[name]
        line = next(x for x in out.splitlines() if f"  {name}  " in x)
        assert status in line and f"{1e3 * doc['measured_step_time_s']:.2f} ms" in line
        times = doc["measured_step_times_s"]  # the first MAX_TIMES, then " ..." if more
        listed = " ".join(f"{1e3 * t:.2f}" for t in times[:MAX_TIMES])
        assert listed + (" ..." if len(times) > MAX_TIMES else "") in line
        assert f"{doc['speedup']:.2f}x" in line
    assert "slower than the original graph" in out
    assert "now running: strategy 2" in out


def test_the_first_report_shows_the_strategy_after_it(dump_dir):
    page = (dump_dir / "strategy-1" / "report.html").read_text()  # refreshed at close
    assert '<a href="../strategy-2/report.html">strategy-2</a>' in page


def chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("headless Chromium is not installed (.ci/run installs Debian's chromium "
                    "package with apt-get; it could not here)")
    return exe


def render(exe, page, tmp_path):
    """(DOM after scripts ran, console errors) of ``page`` in headless Chromium."""
    p = subprocess.run([exe, "--headless", "--disable-gpu", "--no-sandbox",
                        f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr",
                        "--v=0", "--dump-dom", f"file://{page}"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    errors = [x for x in p.stderr.splitlines() if "CONSOLE" in x and re.search(
        r"Uncaught|Error", x)]
    return p.stdout, errors


def test_report_renders_in_chromium(dump_dir, tmp_path):
    exe = chromium()
    broken = tmp_path / "broken.html"  # the console check sees a script error
    broken.write_text("<html><body><script>undefinedFunction();</script></body></html>")
    assert render(exe, broken, tmp_path)[1]
    devices = docs(dump_dir)["strategy-2"]["devices"]
    dom, errors = render(exe, dump_dir / "strategy-2" / "report.html", tmp_path)
    assert errors == []
    assert 'data-ready="1"' in dom  # the page's script ran to its end
    for kind in ("predicted", "measured"):
        rows = sorted(map(int, re.findall(rf'id="fastt-gantt-{kind}-row-(\d+)"', dom)))
        assert rows[:len(devices)] == list(range(len(devices))), kind
        assert len(re.findall(rf'id="fastt-gantt-{kind}-ops-\d+"', dom)) == len(rows)
    assert re.search(r'<figure id="fastt-gantt"><svg', dom)


def test_report_command_refreshes_the_reports(dump_dir, capsys):
    for name in ("strategy-1", "strategy-2"):
        (dump_dir / name / "report.html").unlink()
    assert main(["report", str(dump_dir)]) == 0
    assert capsys.readouterr().out.split() == [str(dump_dir / f"strategy-{k}" / "report.html")
                                               for k in (1, 2)]
    assert '<a href="../strategy-2/report.html">' in (
        dump_dir / "strategy-1" / "report.html").read_text()
