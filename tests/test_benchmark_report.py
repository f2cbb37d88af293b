"""The benchmark report is regenerated from the committed results: every section, every plot,
and the list of runs where fastt loses is computed, not written by hand."""
import json
import os
import shutil

import pytest

pytest.importorskip("matplotlib")

from benchmarks import report  # noqa: E402
from benchmarks.ranking import drift_table, ranking_section, repeat_taus  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "benchmarks", "results")


def test_report_from_the_committed_results(tmp_path):
    for name in ("simulated.json", "real.json"):
        shutil.copy(os.path.join(RESULTS, name), tmp_path / name)
    assert report.main(["--out", str(tmp_path)]) == 0
    text = (tmp_path / "REPORT.md").read_text()
    for heading in ("## Where fastt loses", "## Simulated testbed", "### Ablations of OS-DPOS",
                    "## Real testbed", "## Simulator fidelity"):
        assert heading in text
    for png in ("sim_speedup_strong.png", "sim_speedup_weak.png", "real_samples.png",
                "fidelity.png"):
        assert (tmp_path / png).stat().st_size > 1000
    real = json.loads((tmp_path / "real.json").read_text())
    for r in real["rows"]:
        assert f"| {r['model']} | {r['batch']} |" in text


def test_losses_list_every_baseline_faster_than_fastt():
    sim = {"models": [{"model": "m", "rows": [{"scaling": "strong", "devices": "2xV100",
                                                "strategies": {
                                                    "os-dpos": {"simulated_s": 0.2},
                                                    "m-etf": {"simulated_s": 0.1},
                                                    "heft": {"simulated_s": 0.199}}}]}]}
    real = {"rows": [{"model": "r", "adaptive": {"choice": "one worker"},
                      "step_s": {"one worker": 1.0, "data-parallel": 2.0, "fastt": 1.5}}]}
    lines = report.losses_section(sim, real)
    found = [ln for ln in lines if ln.startswith("- ")]
    assert found == ["- simulated, m strong 2xV100: m-ETF 100.0 ms vs OS-DPOS 200.0 ms (2.00x)",
                     "- measured, r: one worker 1000.0 ms vs fastt 1500.0 ms (1.50x)"]
    assert report.losses_section(None, None)[-2] == "- nowhere"


def test_the_geomean_table_gives_each_device_sets_mean_over_models_and_the_least():
    def row(devices, x, scaling="strong"):
        return {"scaling": scaling, "devices": devices,
                "strategies": {"os-dpos": {"speedup_over_dp": x}}}
    sim = {"models": [{"model": "a", "rows": [row("4xV100", 1.0), row("8xV100", 2.0)]},
                      {"model": "b", "rows": [row("4xV100", 4.0), row("4xV100", 1.1, "weak")]},
                      {"model": "c", "rows": [{**row("4xV100", 0), "strategies": {}}]}]}
    lines = report._geomean_table(sim)
    assert "| strong | 4xV100 | 2 | 2.000 | 1.000 (a) |" in lines
    assert "| strong | 8xV100 | 1 | 2.000 | 2.000 (a) |" in lines
    assert "| weak | 4xV100 | 1 | 1.100 | 1.100 (b) |" in lines


def test_the_bound_table_gives_each_rows_distance_to_the_limit():
    row = {"scaling": "strong", "devices": "4xV100", "strategies": {"os-dpos": {
        "simulated_s": 0.03}}, "bound": {"s": 0.02, "critical_path_s": 0.02, "work_s": 0.015}}
    lines = report._bound_table({"models": [{"model": "m", "rows": [row, {**row, "bound": {
        **row["bound"], "s": 0.025}, "scaling": "weak"}]}]})
    assert "| m | strong | 4xV100 | 20.00 | 15.00 | 20.00 | 30.00 | 1.50 |" in lines
    assert "OS-DPOS / bound: median 1.35, worst 1.50 over 2 rows." in lines
    assert report._bound_table({"models": [{"model": "m", "rows": []}]}) == []


def test_rerunning_some_models_updates_their_rows_of_a_full_run(tmp_path):
    from benchmarks.common import previous_full_run, with_row, write_json
    path = str(tmp_path / "real.json")
    assert previous_full_run(path) is None
    write_json(path, {"meta": {"quick": False}, "rows": [{"model": "a", "x": 1},
                                                          {"model": "c", "x": 1}]})
    doc = previous_full_run(path)
    rows = with_row(doc["rows"], {"model": "a", "x": 2}, ["a", "b", "c"])
    rows = with_row(rows, {"model": "b", "x": 2}, ["a", "b", "c"])
    assert rows == [{"model": "a", "x": 2}, {"model": "b", "x": 2}, {"model": "c", "x": 1}]
    write_json(path, {"meta": {"quick": True}, "rows": []})
    assert previous_full_run(path) is None  # a smoke run is never updated into a full one


def test_a_run_of_measured_times_is_neither_updated_nor_lost_on_another_processor(tmp_path):
    from benchmarks.common import cpu_model, previous_full_run, write_json
    path = str(tmp_path / "real.json")
    here = cpu_model()
    assert here
    write_json(path, {"meta": {"quick": False, "cpu": here}, "rows": [{"model": "a"}]})
    assert previous_full_run(path, here)["rows"] == [{"model": "a"}]
    for meta in ({"quick": False, "cpu": here + " (another)"}, {"quick": False}):
        write_json(path, {"meta": meta, "rows": [{"model": "a"}]})
        with pytest.raises(SystemExit, match="--out DIR"):
            previous_full_run(path, here)
        assert previous_full_run(path)["rows"] == [{"model": "a"}]  # simulated: any machine
        with open(path, encoding="utf-8") as f:
            assert json.load(f)["rows"] == [{"model": "a"}]  # the full run is kept


def test_plan_times_of_this_processor_are_kept_and_of_another_dropped(tmp_path, capsys):
    from benchmarks.common import cpu_model, write_json
    from benchmarks.plan_time import kept_rows
    path, here = str(tmp_path / "plan_time.json"), cpu_model()
    assert kept_rows(path, here) == []
    row = {"model": "a", "devices": "4xV100:dgx1", "scaling": "strong"}
    held = {"model": "b", "devices": "16xV100", "scaling": "held-out"}
    # a row of a device set the benchmark no longer plans over at its scaling (a replaced
    # testbed) is dropped
    write_json(path, {"machine": "m", "cpu": here,
                      "rows": [row, held, {"model": "a", "devices": "4xV100"},
                               {"model": "a", "devices": "16xV100", "scaling": "strong"}]})
    assert kept_rows(path, here) == [row, held]
    for doc in ({"cpu": here + " (another)"}, {}):
        write_json(path, {"machine": "m", **doc, "rows": [row]})
        assert kept_rows(path, here) == []
        assert "a new run starts" in capsys.readouterr().out


def test_the_ranking_is_kendalls_tau_of_predicted_against_measured():
    measured = {"a": 1.0, "b": 2.0, "c": 3.0}
    rows = [{"model": "same", "step_s": measured, "predicted_s": {"a": 1, "b": 5, "c": 9},
             "predicted_contended_s": {"a": 9, "b": 5, "c": 1}},
            {"model": "flat", "step_s": measured, "predicted_s": {"a": 2, "b": 2, "c": 2},
             "predicted_contended_s": {"a": 1, "b": 1, "c": 2}}]
    text = "\n".join(ranking_section({"rows": rows}, ["a", "b", "c"]))
    assert "| same | 3 | +1.00 | -1.00 |" in text
    assert "| flat | 3 | n/a | +0.82 |" in text  # tau-b with a tie: 2 / sqrt(3 * 2)


def test_plans_the_measurements_cannot_tell_apart_tie_in_the_noise_aware_ranking():
    # b and c measure within each other's noise (blocks interleave), a is clearly faster;
    # the prediction orders b and c the other way round
    times = {"a": [1.0, 1.01, 0.99, 1.0, 1.02], "b": [2.0, 2.1, 1.9, 2.05, 1.95],
             "c": [2.03, 1.93, 2.09, 1.98, 2.01]}
    row = {"model": "m", "times_s": times, "step_s": {v: sorted(t)[2] for v, t in times.items()},
           "predicted_s": {"a": 1.0, "b": 2.2, "c": 2.1},
           "predicted_contended_s": {"a": 1.0, "b": 2.2, "c": 2.1}}
    text = "\n".join(ranking_section({"rows": [row]}, ["a", "b", "c"]))
    # raw: b/c discordant; aware: a tie; over the 2 pairs told apart, both concordant
    assert "| m | 3 | +0.33 | +0.33 | +0.82 | +1.00 | 2 |" in text
    far = {**row, "times_s": {**times, "c": [t + 0.5 for t in times["c"]]}}
    text = "\n".join(ranking_section({"rows": [far]}, ["a", "b", "c"]))
    assert "| m | 3 | +0.33 | +0.33 | +0.33 | +0.33 | 3 |" in text  # told apart: discordant


def test_a_perfect_predictions_tau_is_drawn_from_the_repeats_the_plans_shared():
    # the host drifts 30% over the repeats, and b is 1% slower than a in every repeat: as
    # the repeats ran side by side, every redraw keeps a ahead of b
    drift = [1.0, 1.3, 1.1, 1.25, 1.05]
    a = [[d for d in drift]]
    b = [[1.01 * d for d in drift]]
    c = [[3.0 * d for d in drift]]
    assert set(repeat_taus([a, b, c], draws=200)) == {1.0}
    # b a little slower than a over all, but ahead in two repeats: redraws order them
    # either way
    noisy = [[[1.0, 1.3, 1.1, 1.25, 1.05]], [[1.3, 1.0, 1.25, 1.06, 1.12]], c]
    taus = repeat_taus(noisy, draws=400)
    assert 0.2 < sum(t == 1.0 for t in taus) / len(taus) < 0.8
    assert repeat_taus([[[1.0]], [[2.0]]]) == []  # one repeat: nothing to redraw


def test_the_ranking_gives_the_perfect_predictions_chance_per_model_and_for_all():
    times = {"a": [1.0, 1.1, 0.9, 1.0, 1.05], "b": [2.0, 2.2, 1.8, 2.0, 2.1]}
    row = {"model": "m", "times_s": times, "step_s": {v: sorted(t)[2] for v, t in times.items()},
           "predicted_s": {"a": 1.0, "b": 2.0}, "predicted_contended_s": {"a": 1.0, "b": 2.0}}
    text = "\n".join(ranking_section({"rows": [row, {**row, "model": "n"}]}, ["a", "b"]))
    assert "| m | 2 | +1.00 | +1.00 | +1.00 | +1.00 | 1 | +1.00 | 100% |" in text
    assert "on every model at once in 100% of repeats" in text


def test_the_optimality_table_gives_each_placers_ratio_and_the_guarantee():
    from benchmarks.optimality import markdown
    row = {"graph": "g", "ops": 5, "devices": 2, "exact_s": 0.01, "optimal": True, "gap": 0.0,
           "placers": {"DPOS": {"makespan_s": 0.012, "over_optimum": 1.2},
                       "OS-DPOS": {"makespan_s": 0.01, "over_optimum": 1.0},
                       "single": {"error": "does not fit"}},
           "theorem": {"omega_dpos_s": 0.012, "bound_s": 0.025, "holds": True}}
    doc = {"meta": {"machine": "m", "when": "w", "time_limit_s": 60}, "rows": [row]}
    lines = markdown(doc, "##").splitlines()
    assert lines[0] == "## Distance to the optimum (exact program, HiGHS)"
    assert "| g | 5 | 2 | 10.00 | 1.20 | 1.00 | n/a | n/a | n/a | n/a | n/a | 12.00 | 25.00 " \
           "| yes |" in lines
    assert "- DPOS: median gap 20.0%, worst 20.0%, optimal on 0 of 1 graphs" in lines
    assert "- OS-DPOS: median gap 0.0%, worst 0.0%, optimal on 1 of 1 graphs" in lines
    assert "- DPOS's guarantee holds on 1 of 1 graphs" in lines


def test_the_plan_time_section_counts_the_rows_within_the_target():
    from benchmarks.plan_time import TARGET_S, markdown
    row = {"model": "m", "devices": "2x8xV100", "scaling": "strong", "ops": 10, "budget_s": 60,
           "load_s": 1.0, "strategies_s": 2.0, "os_dpos_s": 1.5}
    doc = {"machine": "x", "when": "now",
           "rows": [{**row, "total_s": TARGET_S - 1}, {**row, "total_s": TARGET_S + 1,
                                                       "budget_s": None}]}
    text = markdown(doc, "##")
    assert text.startswith("## `fastt plan` end to end") and "(1 of 2 rows here)" in text
    assert "| m | 2x8xV100 | strong | 10 | 60 | 1.0 | 2.0 | 1.5 | 59.0 | yes | one |" in text
    assert "| none |" in text and text.rstrip().endswith("| no | one |")
    doc["rows"][0].update(totals_s=[55.4, 59.0, 64.1], load_averages=[0.35, 0.93, 1.03])
    assert "| 59.0 | yes | 55.4, 59.0, 64.1; 1.03 at most |" in markdown(doc, "##")


def test_the_drift_table_sets_each_profiled_step_against_its_blocks():
    rows = [{"model": "m", "profiled_step_s": {"one worker": 0.400, "fastt": 0.500},
             "step_s": {"one worker": 0.460, "fastt": 0.450}},
            {"model": "old"}]  # a run from before: no profiled steps
    text = "\n".join(drift_table({"rows": rows}))
    assert "| m | 400.0 -> 460.0 (+15%) | 500.0 -> 450.0 (-10%) |" in text
    assert "Median change +2%, from -10% to +15%." in text
    assert drift_table({"rows": [{"model": "old"}]}) == []
    # a plan measured but not profiled: its first measurement, which calibrates it
    rows[0]["calibrated_step_s"] = {"fastt, replanned": 0.440}
    rows[0]["step_s"]["fastt, replanned"] = 0.462
    text = "\n".join(drift_table({"rows": rows}))
    assert "| model | one worker | fastt | fastt, replanned |" in text
    assert "| m | 400.0 -> 460.0 (+15%) | 500.0 -> 450.0 (-10%) | 440.0 -> 462.0 (+5%) |" in text


def test_the_fidelity_error_is_given_apart_for_plans_that_ran_before_their_blocks():
    from benchmarks.fidelity import _ran_before
    row = {"plan": {"one worker": "k1", "fastt": "k2", "m-topo": "k3", "dp-ps": "k2"},
           "profiled_step_s": {"one worker": 0.4}, "calibrated_step_s": {"fastt": 0.5},
           "predicted_s": {"one worker": 0.44, "fastt": 0.5, "m-topo": 0.9, "dp-ps": 0.45},
           "step_s": {"one worker": 0.4, "fastt": 0.5, "m-topo": 1.0, "dp-ps": 0.5}}
    [_, line] = _ran_before({"rows": [row]}, ["one worker", "fastt", "m-topo", "dp-ps"])
    # dp-ps is the plan fastt is: it ran
    assert "plans that ran before the blocks: 10.0% over 3 runs (worst 10.0%)" in line
    assert "never ran before they were predicted: 10.0% over 1 runs (worst 10.0%)" in line


def test_the_error_net_of_drift_scales_each_models_predictions_by_the_one_workers_shift():
    from benchmarks.fidelity import _net_of_drift
    # the one worker's records were 100, 120 and 110 ms (level 110); its blocks ran at 132 ms:
    # the host slowed by 1.2 for every plan of the model alike
    row = {"reference_step_s": [0.100, 0.120, 0.110],
           "predicted_s": {"one worker": 0.110, "fastt": 0.100},
           "step_s": {"one worker": 0.132, "fastt": 0.100}}
    [_, line] = _net_of_drift({"rows": [row, {"step_s": {}}]}, ["one worker", "fastt"])
    assert "median absolute error 10.0% over 2 runs, worst 20.0%." in line
    assert _net_of_drift({"rows": [{"step_s": {"one worker": 0.1}}]}, ["one worker"]) == []
    # where the run kept the level its samples were scaled to, that level is the yardstick
    row["reference_level_s"] = 0.120  # the host slowed by 1.1
    [_, line] = _net_of_drift({"rows": [row]}, ["one worker", "fastt"])
    assert "median absolute error 9.2% over 2 runs, worst 10.0%." in line  # 8.3%, 10%


def test_the_real_testbeds_block_length_is_given_per_model_where_a_block_spans_a_least_time():
    rows = [{"model": "lenet", "steps_per_block": 92}, {"model": "alexnet",
                                                        "steps_per_block": 10}]
    assert report._block_steps({"meta": {"steps_per_block": 10}, "rows": rows}) == "10 steps"
    timed = {"meta": {"steps_per_block": 10, "min_block_s": 1.0}, "rows": rows}
    assert report._block_steps(timed) == ("at least 10 steps, and at least 1 s "
                                          "(lenet 92, alexnet 10)")


def test_the_sittings_table_sets_each_calibration_sitting_against_the_timed_blocks():
    from benchmarks.ranking import sittings_table
    # the reference's records: its profile, beside the three first sittings, the three second
    refs = [0.9, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    row = {"model": "m", "reference_step_s": refs,
           "plan": {"one worker": "a", "data-parallel": "b", "fastt": "a",
                    "fastt, replanned": "c"},
           "profiled_step_s": {"one worker": 0.9, "data-parallel": 1.8, "fastt": 1.0},
           "calibrated_step_s": {"fastt, replanned": 1.1},
           "recalibrated_step_s": {"data-parallel": 1.5, "fastt": 1.0,
                                   "fastt, replanned": 0.9},
           "step_s": {"one worker": 1.0, "data-parallel": 1.4, "fastt": 1.0,
                      "fastt, replanned": 1.0}}
    text = "\n".join(sittings_table({"rows": [row, {"model": "old"}]}))
    # the first sitting of data-parallel was scaled to the level of refs[1:2] (2.0), the
    # replanned plan's to that of refs[1:4] (1.0); the second ones to refs[1:5], refs[1:7]
    assert "| m | data-parallel | 0.90 | 1.50 | 1.40 |" in text
    assert "| m | fastt, replanned | 1.10 | 0.90 | 1.00 |" in text
    assert "| m | fastt |" not in text  # it ran as the one worker's plan
    assert "first sitting median 22.9%, worst 35.7%, beyond 12% in 1" in text
    assert "their mean (the calibration) median 7.1%, worst 14.3%, beyond 12% in 1" in text
    assert sittings_table({"rows": [{"model": "old"}]}) == []


def test_the_sections_kept_by_hand_survive_a_regeneration(tmp_path):
    shutil.copy(os.path.join(RESULTS, "real.json"), tmp_path / "real.json")
    (tmp_path / "REPORT.md").write_text(
        "# fastt benchmark report\n\n## Summary\n\n| a headline |\n\n"
        f"{report.CALIBRATION_RULES}\n\nrun 18: -11.5%\n\n## Real testbed\n\nold table\n")
    assert report.main(["--out", str(tmp_path)]) == 0
    text = (tmp_path / "REPORT.md").read_text()
    assert "## Summary\n\n| a headline |" in text
    assert f"{report.CALIBRATION_RULES}\n\nrun 18: -11.5%" in text
    assert "old table" not in text
