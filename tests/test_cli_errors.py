"""Bad input to the ``fastt`` command ends in one line ``fastt: error: ...`` naming what was
wrong, and exit code 2, never a traceback: files read (missing, a directory, empty, not UTF-8,
not JSON, JSON of the wrong shape), output locations that cannot be written, values out of
range. Also: planning over one device, the plugin's names in ``TF_CONFIG``, ``FASTT_*`` and
cluster jobs, and where the example scripts checkpoint. No TensorFlow in this process."""
import gc
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fastt.cli import main
from tests.bad_input import run as bad_input
from tests.bad_input.cases import CASES, Case, fixtures, problems

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    """(fixtures' directory, a directory nothing can be created in)."""
    root = tmp_path_factory.mktemp("bad-input")
    return root, fixtures(root)


@pytest.fixture(autouse=True)
def collector():
    """'fastt plan' turns the garbage collector off for its process: back on after a test."""
    yield
    gc.enable()


def run_main(argv, capsys):
    """(exit code, stdout, stderr) of ``fastt argv`` in this process."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's errors
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def check(case: Case, where, capsys):
    root, ro = where
    code, out, err = run_main(case.args(root, ro), capsys)
    assert problems(case, code, out, err, root, ro) == [], err


def cases(kind):
    return [pytest.param(c, id=c.id) for c in CASES if c.kind == kind and not c.tensorflow]


@pytest.mark.parametrize("case", cases("files"))
def test_a_bad_file_is_named_in_one_error_line(case, where, capsys):
    """Device, cost-model, cluster state and dump files; graph files before TensorFlow."""
    check(case, where, capsys)


@pytest.mark.parametrize("case", cases("outputs"))
def test_an_output_that_cannot_be_written_is_named_before_the_work(case, where, capsys):
    """--json, --dump, --out, the cluster state and report.html: a directory where a file
    belongs (or the reverse), a parent that is a file or missing, a read-only directory."""
    check(case, where, capsys)


@pytest.mark.parametrize("case", cases("values"))
def test_a_bad_value_is_named_in_one_error_line(case, where, capsys):
    """--batch-size -4 and 0, --bucket-mb, --devices, --steps, --top, --workers, --port,
    and fastt worker's --cluster, --index, --job and --threads."""
    check(case, where, capsys)


@pytest.fixture
def small_planning(monkeypatch):
    """``fastt plan`` on a small training graph with static costs, without TensorFlow."""
    from fastt import plan_cmd
    from fastt.sched.placers import exact
    from tests.helpers import training_graph
    from tests.helpers import costs
    monkeypatch.setattr(plan_cmd, "load", lambda *args: training_graph(B=16))
    monkeypatch.setattr(plan_cmd, "cost_source", lambda g, ds, *args: costs(ds, g))
    monkeypatch.setattr(exact, "TIME_LIMIT_S", 1.0)
    return ["--model", "small_cnn", "--fetch", "update", "--fetch", "loss"]


@pytest.mark.parametrize("command", ["plan", "compare"])
def test_one_device_is_a_trivial_plan_without_data_parallelism(command, small_planning,
                                                                capsys):
    code, out, err = run_main([command, *small_planning, "--devices", "1xV100"], capsys)
    assert code == 0 and "Traceback" not in err, err
    assert re.search(r"^os-dpos \* +\d+\.\d{3} ms", out, re.M), out
    for name in ("data-parallel", "data-parallel-ps"):
        assert re.search(rf"^{name} +not computed: {name} replicates the model on every "
                         r"device: it needs at least 2 devices \(1 given\)$", out, re.M), out
    assert "devices 1xV100 (1)" in out


def test_data_parallelism_asked_for_over_one_device_is_an_error(small_planning, capsys):
    code, _, err = run_main(["plan", *small_planning, "--devices", "1xV100", "--strategy",
                             "data-parallel"], capsys)
    lines = err.splitlines()
    assert code == 2 and "Traceback" not in err
    assert [x for x in lines if x.startswith("fastt: error:")] == [lines[-1]]
    assert lines[-1] == ("fastt: error: data-parallel replicates the model on every device: "
                         "it needs at least 2 devices (1 given)")


@pytest.mark.parametrize("jobs, culprit", [
    ({"worker": {"x": "127.0.0.1:2222"}}, "task key 'x'"),
    ({"worker": {"0": "127.0.0.1:2222", "one": "127.0.0.1:2223"}}, "task key 'one'"),
    ({"worker": {"-1": "127.0.0.1:2222"}}, "task key '-1'"),
    ({"worker": {"1.5": "127.0.0.1:2222"}}, "task key '1.5'"),
    ({"worker": {"1": "127.0.0.1:2222", "01": "127.0.0.1:2223"}}, "given twice"),
    ({"worker": {"0": 2222}}, "job 'worker'"),
])
def test_tf_config_sparse_jobs_name_the_bad_key(jobs, culprit):
    import json

    from fastt.plugin.settings import SettingsError, from_env
    with pytest.raises(SettingsError) as e:
        from_env({"TF_CONFIG": json.dumps({"cluster": jobs})})
    assert str(e.value).startswith("TF_CONFIG") and culprit in str(e.value)


def test_tf_config_sparse_jobs_keep_their_task_indices():
    from fastt.plugin.settings import from_env
    doc = '{"cluster": {"worker": {"3": "127.0.0.1:2224", "1": "127.0.0.1:2222"}}}'
    tasks = from_env({"TF_CONFIG": doc}).cluster.tasks
    assert [(t.index, t.address) for t in tasks] == [(1, "127.0.0.1:2222"),
                                                     (3, "127.0.0.1:2224")]
    assert tasks[1].device_prefix == "/job:worker/replica:0/task:3"


@pytest.mark.parametrize("env, expected", [
    ({"FASTT_STRATEGY": "OS-DPOS"}, "os-dpos"),
    ({"FASTT_STRATEGY": " Data-Parallel "}, "data-parallel"),
    ({"FASTT_LOG_LEVEL": "debug"}, "DEBUG"),
    ({"FASTT_TRANSFER_PRIORITIES": "AUTO"}, "auto"),
])
def test_names_are_read_in_any_case(env, expected):
    from fastt.plugin.settings import from_env
    s = from_env(env)
    assert expected in (s.strategy, s.log_level, s.transfer_priorities)


def test_the_commands_read_strategy_names_in_any_case():
    from fastt.cli import build_parser
    args = build_parser().parse_args(["plan", "--model", "mlp", "--devices", "2xV100",
                                      "--strategy", "OS-DPOS", "--transfer-priorities", "On"])
    assert (args.strategy, args.transfer_priorities) == ("os-dpos", "on")


@pytest.mark.parametrize("env, variable, culprit", [
    ({"TF_CONFIG": '{"cluster": {"my job": ["127.0.0.1:2222"]}}'}, "TF_CONFIG", "'my job'"),
    ({"TF_CONFIG": '{"cluster": {"1worker": ["127.0.0.1:2222"]}}'}, "TF_CONFIG", "'1worker'"),
    ({"TF_CONFIG": '{"cluster": {"work-er": ["127.0.0.1:2222"]}}'}, "TF_CONFIG", "'work-er'"),
    ({"TF_CONFIG": '{"cluster": {"": ["127.0.0.1:2222"]}}'}, "TF_CONFIG", "''"),
    ({"FASTT_DEVICES": "/job:my job/task:0/device:CPU:0"}, "FASTT_DEVICES", "'/job:my job"),
    ({"FASTT_DEVICES": "/job:work-er/task:0/device:CPU:0"}, "FASTT_DEVICES", "'/job:work-er"),
    ({"FASTT_STRATEGY": "OS DPOS"}, "FASTT_STRATEGY", "'OS DPOS'"),
])
def test_names_that_tensorflow_or_fastt_would_not_take_name_the_variable(env, variable,
                                                                        culprit):
    from fastt.plugin.settings import SettingsError, from_env
    with pytest.raises(SettingsError) as e:
        from_env(env)
    assert str(e.value).startswith(variable) and culprit in str(e.value)


def test_job_names_follow_tensorflows_rule():
    """A letter, then letters, digits and underscores, either case (TensorFlow's
    ``IsJobName``)."""
    from fastt.plugin.settings import from_env
    doc = '{"cluster": {"Chief_0": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]}}'
    assert [t.job for t in from_env({"TF_CONFIG": doc}).cluster.tasks] == ["Chief_0", "worker"]
    assert from_env({"FASTT_DEVICES": "/job:Ps_1/task:0/device:CPU:0"}).devices == [
        "/job:Ps_1/replica:0/task:0/device:CPU:0"]


CHECKPOINTING = ("session_feed_dict.py", "monitored_tf_data.py", "slim_train.py")


@pytest.mark.parametrize("script", CHECKPOINTING)
def test_examples_checkpoint_in_a_new_private_directory_by_default(script):
    """No fixed path in the shared temporary directory, which another local user could
    create first: ``--out``, else a new directory of ``tempfile.mkdtemp``."""
    text = (ROOT / "examples" / script).read_text()
    assert "/tmp" not in text and "gettempdir" not in text
    assert re.search(r'^out = args\.out or tempfile\.mkdtemp\(prefix="fastt-example-[a-z]+-"\)$',
                     text, re.M)
    assert "args.out" not in text.replace("out = args.out or", "")


def test_an_example_run_checkpoints_where_no_one_else_could_have_written(tmp_path):
    """The old fixed path planted by someone else is left alone; the checkpoint goes to a
    new directory only its user can enter."""
    planted = tmp_path / "fastt-example-session"
    planted.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTT")}
    env.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=str(tmp_path))
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "session_feed_dict.py"),
                        "--steps", "1", "--batch", "4"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    path = Path(re.search(r"^checkpoint: (.+)$", p.stdout, re.M).group(1))
    folder = path.parent
    assert folder.parent == tmp_path and folder.name.startswith("fastt-example-session-")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert not any(planted.iterdir())


SAMPLE = ("plan-devices-latin1", "compare-costs-list", "plan-json-a-directory",
          "plan-batch-size=0", "inspect-dump-trace-shape", "report-report-html-a-directory",
          "cluster-status-state-broken", "cluster-up-state-under-a-file", "demo-out-a-file",
          "worker-cluster-hello")


def test_the_bad_input_set_ends_in_fastt_errors(where, tmp_path):
    """The whole set of ``tests/bad_input`` again (in this process, the quick way), a sample
    of it as a user runs it (``fastt`` in its own process); the committed transcript lists
    every case."""
    transcript = tmp_path / "transcript.txt"
    assert bad_input.main(["--in-process", "--no-tensorflow", "--out", str(transcript)]) == 0
    text = transcript.read_text()
    assert "Traceback" not in text and "fastt: error:" in text
    root, ro = where
    by_id = {c.id: c for c in CASES}
    for name in SAMPLE:
        code, out, err, _ = bad_input.run(by_id[name], root, ro)
        assert problems(by_id[name], code, out, err, root, ro) == [], (name, err)
    committed = (ROOT / "tests" / "bad_input" / "transcript.txt").read_text()
    listed = set(re.findall(r"^## (\S+) ", committed, re.M))
    assert listed == set(by_id), ("tests/bad_input/transcript.txt is out of date: run python "
                                  "tests/bad_input/run.py --out tests/bad_input/transcript.txt")
    assert "Traceback" not in committed and "\ncheck: ok\n" in committed
    assert not re.search(r"^check: (?!ok$)", committed, re.M)
