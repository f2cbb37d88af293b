"""The four unchanged example scripts, run as a user would: without fastt, then with
``FASTT=1 FASTT_DEVICES=cpu:2``. Same final loss, a strategy dump, the activation in the log."""
import importlib.util
import json
import re

import pytest

from tests.helpers import EXAMPLES, run, side_by_side


@pytest.mark.parametrize("script", list(EXAMPLES))
def test_example_trains_the_same_with_fastt(script, tmp_path):
    needs = EXAMPLES[script]
    if needs and importlib.util.find_spec(needs) is None:
        pytest.skip(f"{script} needs {needs} (installed by the README's test command)")
    (plain_loss, plain_out, _), (loss, out, err) = side_by_side(
        lambda: run(script, tmp_path, fastt=False), lambda: run(script, tmp_path, fastt=True))
    assert loss == pytest.approx(plain_loss, rel=1e-3)
    dumps = sorted((tmp_path / "dump").glob("strategy-*/strategy.json"))
    assert dumps, err[-3000:]
    docs = [json.loads(p.read_text()) for p in dumps]
    # a short run may close while a strategy is still being measured: it is recorded too
    assert {d["status"] for d in docs} <= {"active", "superseded", "rolled_back", "unfinished"}
    assert all(d["reason"] for d in docs if d["status"] in ("rolled_back", "unfinished"))
    # in this process; a kept plan may be tried in TensorFlow's own order after it
    assert {d["order_mechanism"] for d in docs if d["ordered"]} == {"priority-executor"}
    assert all(d["order_mechanism"] == "none" for d in docs if not d["ordered"])
    assert re.search(r"fastt: (activated|rolled back|left) strategy 1 \(", err)
    assert len(dumps) == int(re.search(r"(\d+) strateg(?:y|ies) tried", err).group(1))
    assert_dumps_follow_the_schema(tmp_path / "dump")
    if script == "monitored_tf_data.py":  # the same samples, in the same order
        samples = re.compile(r"samples: .*")
        assert samples.search(out).group(0) == samples.search(plain_out).group(0)
        assert "2560 seen, 1280 distinct" in out


def assert_dumps_follow_the_schema(root):
    """Every file of every strategy dump validates against its documented schema; each dump
    has its report, predicted trace and graph, and a measured trace once it ran (one left
    unfinished may have closed before its traced step)."""
    from fastt.inspect import schema
    for d in sorted(root.glob("strategy-*")):
        names = {p.name for p in d.iterdir()}
        ran = json.loads((d / "strategy.json").read_text())["status"] != "unfinished"
        assert {"strategy.json", "cost_models.json", "predicted_trace.json", "graph.dot",
                "report.html", *(["measured_trace.json"] if ran else [])} <= names, (d, names)
        for name, kind in schema.FILES.items():
            if name in names:
                assert schema.validate(json.loads((d / name).read_text()), kind) == [], (d, name)


def test_a_pipeline_trains_the_same_with_fastt(tmp_path):
    """``FASTT_STRATEGY=pipedream``: the unchanged script trains a micro-batched pipeline
    over the two devices to the same loss; its dump and report name the stages and the
    micro-batches (the report's Gantt chart draws the bubbles)."""
    plain_loss, _, _ = run("session_feed_dict.py", tmp_path, fastt=False)
    loss, _, err = run("session_feed_dict.py", tmp_path, fastt=True,
                       fastt_env={"FASTT_DEVICES": "cpu:2", "FASTT_STRATEGY": "pipedream"})
    assert loss == pytest.approx(plain_loss, rel=1e-3)
    doc = json.loads((tmp_path / "dump" / "strategy-1" / "strategy.json").read_text())
    assert doc["strategy"] == "pipedream" and doc["replicas"] >= 2, err[-3000:]
    assert len(set(doc["placement"].values())) == 2 and doc["note"].startswith("stages: ")
    assert_dumps_follow_the_schema(tmp_path / "dump")
    html = (tmp_path / "dump" / "strategy-1" / "report.html").read_text()
    assert "micro-batches" in html and "stages: slices" in html  # what the pipeline is


def test_device_memory_decides_what_fastt_tries(tmp_path):
    """``FASTT_DEVICE_MEMORY_MB``: with 16 MB a data-parallel replica of the script's model
    fits, by fastt's memory model, and fastt tries it; with 12 MB a replica as it is does not,
    and fastt plans one fitted (micro-batches in turn or recomputed activations) and says so;
    with 4 MB nothing fits (every placer's plan is checked, the pipelines' by their simulated
    peak), so fastt says which device would overflow and by how much, and the unchanged script
    trains on the original graph to the same loss."""
    plain_loss, _, _ = run("session_feed_dict.py", tmp_path, fastt=False)
    loss, _, err = run("session_feed_dict.py", tmp_path / "16", fastt=True, fastt_env={
        "FASTT_DEVICES": "cpu:2", "FASTT_DEVICE_MEMORY_MB": "16"})
    assert loss == pytest.approx(plain_loss, rel=1e-3)
    assert "planned data-parallel" in err, err[-3000:]
    loss, _, err = run("session_feed_dict.py", tmp_path / "12", fastt=True, fastt_env={
        "FASTT_DEVICES": "cpu:2", "FASTT_DEVICE_MEMORY_MB": "12"})
    assert loss == pytest.approx(plain_loss, rel=1e-3)
    assert "a data-parallel replica does not fit the devices' memory" in err, err[-3000:]
    assert re.search(r"planned os-dpos .*(micro-batches in turn|forward ops recomputed).* \(to "
                     r"fit the devices' memory\)", err), err[-3000:]
    loss, _, err = run("session_feed_dict.py", tmp_path / "4", fastt=True, fastt_env={
        "FASTT_DEVICES": "cpu:2", "FASTT_DEVICE_MEMORY_MB": "4"})
    assert loss == pytest.approx(plain_loss, rel=1e-3)
    assert re.search(r"DoesNotFit: .*(would hold [\d.]+ MiB, more than its 4\.0 MiB|fits in no "
                     r"device's remaining memory); training continues on the original graph",
                     err), err[-3000:]
    assert not (tmp_path / "4" / "dump" / "strategy-1").exists()
