"""Strategy inspection without TensorFlow: the schemas and their validator, predicted and
measured Chrome traces, the placed graph, report.html, and `fastt inspect` / `fastt report`."""
import json
import logging
import os
import re
import sys
from types import SimpleNamespace as NS

import pytest

from fastt import plan_cmd
from fastt.cli import main
from fastt.costs import CostModels
from fastt.inspect import dumps, figures, graphviz, report, schema, trace, writer
from fastt.inspect.trace import Slice
from fastt.profiler import ComputeSample
from fastt.sched.sim.device_spec import parse
from fastt.costs.source import ModelCosts
from fastt.passes.splitting import Split
from fastt.sched.strategy import plan
from tests.helpers import training_graph
from tests.helpers import costs

CPU = "/job:localhost/replica:0/task:0/device:CPU:{}"
FETCHES = ["update", "loss"]


def planned(name="m-topo", splits=()):
    ds = parse("2xV100")
    g = training_graph(B=16)
    c = costs(ds, g)
    return ds, g, c, plan(g, ds.devices, c, name, fetches=FETCHES, splits=list(splits))


def assert_lanes_apart(doc):
    """Events of one (process, thread) never overlap: Perfetto nests them properly."""
    by_track = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        spans.sort()
        assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:]))
    return by_track


def test_the_validator_names_what_is_wrong():
    _, _, _, s = planned()
    hist = [writer.history_entry(1, s.name, "planned", s.predicted_step_time_s, dump="x")]
    doc = json.loads(json.dumps(writer.document(s, source="plan", session="plan-1", n=1,
                                               status="planned", history=hist)))
    assert schema.validate(doc, "strategy") == []
    bad = json.loads(json.dumps(doc))
    bad["status"] = "bogus"
    bad["splits"] = [["h", "batch", 1]]
    bad["history"][0]["measured_step_time_s"] = "fast"
    bad["extra"] = 1
    del bad["placement"]
    errors = schema.validate(bad, "strategy")
    assert any(e.startswith("$.status: 'bogus' is not one of") for e in errors)
    assert any(e.startswith("$.splits[0][2]: 1 is below the minimum 2") for e in errors)
    assert any(e.startswith("$.history[0].measured_step_time_s: str") for e in errors)
    assert "$: unexpected key 'extra'" in errors and "$: missing key 'placement'" in errors
    with pytest.raises(schema.DumpError, match="strategy.json does not follow"):
        schema.check(bad, "strategy", "strategy.json")


def test_predicted_trace_replays_the_strategy():
    ds, g, c, s = planned("m-topo")
    doc = trace.predicted(s, ds.devices, c, g.fan_in(FETCHES), ds.copy_bytes_per_s)
    assert schema.validate(doc, "trace") == []
    info = doc["otherData"]["fastt"]
    assert info["kind"] == "predicted" and info["devices"] == s.devices
    assert info["step_time_s"] == pytest.approx(s.predicted_step_time_s)
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["name"] == "process_name"}
    assert names == {1: "GPU:0", 2: "GPU:1"}
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "op"]
    assert sorted(e["name"] for e in ops) == sorted(s.placement)
    assert all(s.devices[e["pid"] - 1] == s.placement[e["name"]] == e["args"]["device"]
               for e in ops)
    moves = [e for e in doc["traceEvents"] if e.get("cat") == "transfer"]
    assert moves and all(e["tid"] >= trace.TRANSFER_TID for e in moves)
    assert all(e["args"]["dst"] == s.devices[e["pid"] - 1] != e["args"]["src"] for e in moves)
    assert_lanes_apart(doc)
    rows = trace.rows(doc)
    assert [r.device for r in rows] == s.devices
    assert sum(r.busy_s for r in rows) == pytest.approx(
        sum(c.compute(n, "") for n in s.placement))


def node(name, label_type, start_us, op_us, end_us, inputs=""):
    return NS(node_name=name, all_start_micros=start_us, all_start_nanos=start_us * 1000,
              op_start_rel_nanos=0, op_end_rel_nanos=op_us * 1000,
              op_start_rel_micros=0, op_end_rel_micros=op_us, all_end_rel_micros=end_us,
              all_end_rel_nanos=end_us * 1000,
              timeline_label=f"{name} = {label_type}({inputs})")


def test_measured_trace_has_a_process_per_device_and_transfer_lanes():
    worker = "/job:worker/replica:0/task:1/device:CPU:0"
    meta = NS(step_stats=NS(dev_stats=[
        NS(device=CPU.format(0), node_stats=[
            node("_SOURCE", "NoOp", 100, 1, 1),
            node("a", "MatMul", 100, 50, 52), node("b", "Conv2D", 120, 60, 61),
            node("c", "Relu", 200, 10, 10),
            node("RecvTensor", "RecvTensor", 130, 0, 30)]),
        NS(device="/cpu:1", node_stats=[node("a/_1", "_Recv", 150, 1, 20),
                                        node("d", "MatMul", 171, 20, 20, "a/_1")]),
        NS(device=worker, node_stats=[node("e", "Add", 300, 5, 5)]),
    ]))
    doc = trace.measured(meta, [CPU.format(0), CPU.format(1)], "os-dpos")
    assert schema.validate(doc, "trace") == []
    info = doc["otherData"]["fastt"]
    assert info["devices"] == [CPU.format(0), CPU.format(1), worker]
    assert info["step_time_s"] == pytest.approx(205e-6)  # 100 us to 305 us
    tracks = assert_lanes_apart(doc)
    assert sorted(tracks) == [(1, 0), (1, 1), (1, 1000), (2, 0), (2, 1000), (3, 0)]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
               if e["name"] == "thread_name"}
    assert threads[(1, 1)] == "ops 2" and threads[(2, 1000)] == "transfers"
    by_name = {e["name"]: e for e in doc["traceEvents"] if e["ph"] == "X"}
    assert "_SOURCE" not in by_name
    assert by_name["b"]["ts"] == 20.0 and by_name["b"]["dur"] == 60.0
    assert by_name["a/_1"]["cat"] == "transfer" and by_name["RecvTensor"]["cat"] == "transfer"
    rows = trace.rows(doc)
    assert rows[0].busy_s == pytest.approx(90e-6)  # [0, 80] and [100, 110] us
    assert [len(r.transfers) for r in rows] == [1, 1, 0]
    with pytest.raises(Exception, match="not a RunMetadata"):
        trace.measured(NS(), [])


def test_lanes_are_packed_tightly():
    slices = [Slice("d", a, b, "x") for a, b in ((0, 2), (1, 3), (2, 4), (3, 5), (3, 3))]
    assert trace.pack(slices) == [0, 1, 0, 1, 2]


def test_the_placed_graph_has_a_cluster_per_device(tmp_path):
    _, g, _, s = planned("m-topo")
    text = graphviz.to_dot(s)
    assert text.startswith('digraph "m-topo" {') and text.rstrip().endswith("}")
    assert text.count("subgraph \"cluster_") == 2
    assert '"w/read" -> "h";' in text and 'label="h\\nMatMul"' in text
    assert graphviz.write(s, str(tmp_path))[0].endswith("graph.dot")


def plan_dumps(tmp_path, names=("os-dpos", "m-topo"), splits=()):
    ds = parse("2xV100")
    g = training_graph(B=16)
    setup = plan_cmd.Setup(g, "2xV100", ds, FETCHES, costs(ds, g))
    strategies = [plan(g, ds.devices, setup.costs, n, fetches=FETCHES,
                       splits=list(splits) if n == "dpos" else []) for n in names]
    return setup, strategies, plan_cmd.write_dumps(str(tmp_path), setup, strategies)


def test_planned_dumps_follow_their_schemas_and_report_every_section(tmp_path):
    split = Split("h", "rows", 2, time_before_s=5e-3, param_bytes=48, step_before_s=0.02,
                  step_after_s=0.015)
    _, strategies, paths = plan_dumps(tmp_path, ("dpos", "m-topo"), splits=[split])
    assert [os.path.basename(p) for p in paths] == ["strategy-1", "strategy-2"]
    for p in paths:
        for name, kind in schema.FILES.items():
            if os.path.exists(os.path.join(p, name)):
                with open(os.path.join(p, name)) as f:
                    assert schema.validate(json.load(f), kind) == [], (p, name)
        assert sorted(os.listdir(p)) == ["graph.dot", "predicted_trace.json", "report.html",
                                         "strategy.json"]
    page = open(os.path.join(paths[0], "report.html")).read()
    rows = sorted(map(int, re.findall(r'id="fastt-gantt-predicted-row-(\d+)"', page)))
    assert rows == [0, 1] and "fastt-gantt-measured-row" not in page
    assert "<td>h</td><td>rows</td><td class=\"num\">2</td>" in page
    assert "<td class=\"num\">5.000 ms</td><td class=\"num\">48</td>" in page
    assert "No measured step: this strategy was only planned" in page
    assert "No cost models in this dump" in page
    assert '<a href="../strategy-2/report.html">strategy-2</a>' in page  # the history
    assert not re.search(r"(src|href)=\"[a-z]+:|<link|@import|url\([a-z]+:", page)  # offline
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids))  # the inline figures do not share ids


def test_a_dump_with_cost_models_shows_each_link_fit_and_its_samples(tmp_path):
    ds = parse("2xV100")
    g = training_graph(B=16)
    gpus = [d.name for d in ds.devices]
    models = CostModels()
    models.compute.update(ComputeSample(op.name, d, 1e-3) for op in g for d in gpus)
    for k in range(1, 6):
        models.comm.add_sample(gpus[0], gpus[1], k * 1e6, 1e-5 + k * 1e-4)  # 10 GB/s
        models.comm.add_sample(gpus[1], gpus[0], k * 1e6, 2e-5 + k * 2e-4)
    setup = plan_cmd.Setup(g, "2xV100", ds, FETCHES, ModelCosts(models))
    s = plan(g, ds.devices, setup.costs, "m-topo", fetches=FETCHES)
    [path] = plan_cmd.write_dumps(str(tmp_path), setup, [s])
    with open(os.path.join(path, "cost_models.json")) as f:
        assert schema.validate(json.load(f), "cost_models") == []
    with open(os.path.join(path, "predicted_trace.json")) as f:
        moves = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "transfer"]
    assert moves and all(e["dur"] > 0 for e in moves)  # the links' fits cost them
    page = open(os.path.join(path, "report.html")).read()
    assert re.search(r"<td>GPU:0</td><td>GPU:1</td><td class=\"num\">5</td>"
                     r"<td class=\"num\">10\.0</td><td class=\"num\">10\.000</td>"
                     r"<td class=\"num\">1\.000</td>", page)
    assert "<td>GPU:1</td><td>GPU:0</td><td class=\"num\">5</td>" in page
    assert '<figure id="fastt-comm"><svg' in page


def test_a_dump_refreshes_only_what_changes(tmp_path):
    setup, strategies, paths = plan_dumps(tmp_path, ("m-topo",))
    dump = dumps.load(paths[0])
    before = os.path.getmtime(os.path.join(paths[0], "predicted_trace.json"))
    doc = dict(dump.doc, status="failed", reason="injected")
    writer.write(paths[0], doc, predicted=lambda: pytest.fail("the trace is written once"))
    assert os.path.getmtime(os.path.join(paths[0], "predicted_trace.json")) == before
    assert dumps.load(paths[0]).doc["reason"] == "injected"
    assert "injected" in open(os.path.join(paths[0], "report.html")).read()
    assert os.path.basename(writer.new_dir(str(tmp_path))) == "strategy-2"


def test_without_matplotlib_reports_have_tables_and_one_warning(tmp_path, monkeypatch, caplog):
    _, _, paths = plan_dumps(tmp_path, ("m-topo", "heft"))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    monkeypatch.setattr(figures, "_warned", False)
    with caplog.at_level(logging.WARNING, logger="fastt"):
        pages = [report.render(dumps.load(p)) for p in paths]
    assert [r.message for r in caplog.records].count(
        "fastt: matplotlib is not installed; reports are written without charts "
        "(pip install matplotlib)") == 1 and len(caplog.records) == 1
    for page in pages:
        assert "<svg" not in page and "Charts need matplotlib" in page
        assert "<h2>Devices</h2>" in page and "<h2>Splits</h2>" in page


def session_dumps(root):
    """Two strategies of one plugin session: the first rolled back, the second active."""
    ds, g, c, s1 = planned("m-topo")
    s2 = plan(g, ds.devices, c, "os-dpos", fetches=FETCHES)
    history = [writer.history_entry(1, s1.name, "rolled_back", s1.predicted_step_time_s,
                                   "measured 9.00 ms/step, slower than the original graph",
                                   measured_s=[9e-3, 9.2e-3], activated_at_step=5),
               writer.history_entry(2, s2.name, "active", s2.predicted_step_time_s,
                                   measured_s=[6e-3, 6.4e-3, 6.2e-3], activated_at_step=12)]
    for k, (s, h) in enumerate(zip((s1, s2), history), 1):
        doc = writer.document(s, source="session", session="123-1", n=k, status=h["status"],
                             reason=h["reason"], measured_s=h["measured_step_times_s"],
                             original_s=[8e-3, 8.1e-3], activated_at_step=k * 6,
                             order_mechanism="priority-executor", history=history[:k])
        writer.write(writer.new_dir(str(root)), doc, strategy=s, report=False, strict=True)


def test_a_trial_of_a_kept_plan_in_tensorflows_order_is_dumped_as_unordered():
    """The FIFO trial of a kept plan runs its very strategy: its dump says its steps ran
    in TensorFlow's own order, as the kept plan's says they ran in the planned one."""
    from fastt.plugin import session_dumps
    from fastt.plugin.entry import Entry
    s = planned("os-dpos")[3]
    kept = Entry(1, s.name, s, s.predicted_step_time_s, status="superseded")
    trial = Entry(2, s.name, s, s.predicted_step_time_s, status="active", ordered=False)
    docs = [session_dumps.document(e, [kept, trial], [8e-3], "priority-executor", "123-1")
            for e in (kept, trial)]
    assert s.ordered and [d["ordered"] for d in docs] == [True, False]
    assert [d["order_mechanism"] for d in docs] == ["priority-executor", "none"]
    assert s.to_dict()["ordered"] is True  # the strategy itself is left as it was
    for d in docs:
        assert schema.validate(d, "strategy") == []


def test_inspect_prints_every_strategy_with_its_step_times(tmp_path, capsys):
    session_dumps(tmp_path)
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "2 strategies in 1 session" in out and "original graph 8.05 ms/step" in out
    rolled = next(line for line in out.splitlines() if "rolled back" in line and "m-topo" in line)
    active = next(line for line in out.splitlines() if " active " in line and "os-dpos" in line)
    assert "9.10 ms" in rolled and "0.88x" in rolled and "9.00 9.20" in rolled
    assert "slower than the original graph" in rolled
    assert "6.20 ms" in active and "1.30x" in active and "6.00 6.40 6.20" in active
    assert "now running: strategy 2 (os-dpos)" in out
    assert main(["inspect", str(tmp_path / "strategy-1")]) == 0  # one dump
    assert "1 strategy in 1 session" in capsys.readouterr().out


def test_report_command_writes_every_report_with_the_whole_history(tmp_path, capsys):
    session_dumps(tmp_path)
    assert not (tmp_path / "strategy-1" / "report.html").exists()
    assert main(["report", str(tmp_path)]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / f"strategy-{k}" / "report.html")
                                               for k in (1, 2)]
    first = (tmp_path / "strategy-1" / "report.html").read_text()
    assert '<a href="../strategy-2/report.html">strategy-2</a>' in first  # written later


def test_commands_name_what_is_wrong(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "none")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    assert "no strategy dumps in" in capsys.readouterr().err
    (tmp_path / "strategy-1").mkdir()
    (tmp_path / "strategy-1" / "strategy.json").write_text('{"schema": "fastt.session-strategy",'
                                                          ' "schema_version": 3, "n": 0}')
    assert main(["inspect", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "does not follow the strategy schema: $: missing key 'source'" in err


def test_the_dump_schema_names_every_registered_strategy_and_a_fitted_step():
    from fastt.inspect.schema import schema
    from fastt.sched.registry import names
    enum = schema("strategy")["$defs"]["strategy_name"]["enum"]
    assert enum == list(names()) + ["memory-fit"] and "os-dpos" in enum
