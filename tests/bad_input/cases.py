"""The bad inputs of the ``fastt`` command: each command's file, directory and value options
given a missing file, a directory instead of a file (and the reverse), an empty file, bytes
that are not UTF-8, text that is not JSON, JSON of the wrong shape, an output location that
cannot be written, and values out of range. Each case names what its one error line must
name. ``fixtures`` makes the files the cases read, without TensorFlow.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

# the files a reading option is tried with: fixture name -> what is wrong with it
BAD_FILES = {
    "missing.json": "does not exist",
    "adir": "is a directory",
    "empty.json": "is empty",
    "latin1.json": "is not UTF-8",
    "broken.json": "is not JSON",
    "list.json": "holds an array, expected an object",
}


@dataclass(frozen=True)
class Case:
    """``fastt`` run with ``argv`` (``{root}``: the fixtures' directory, ``{ro}``: a
    directory nothing can be created in); its error line names each of ``culprits``."""
    id: str
    kind: str  # files (a file or directory read), outputs (written), values, devices, cluster
    argv: tuple[str, ...]
    culprits: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    tensorflow: bool = False  # reached only once TensorFlow is imported (subprocess only)
    ok: bool = False  # the command succeeds: its output, not an error, is checked

    def args(self, root: Path, ro: Path) -> list[str]:
        return [a.format(root=root, ro=ro) for a in self.argv]

    def names(self, root: Path, ro: Path) -> list[str]:
        return [c.format(root=root, ro=ro) for c in self.culprits]


def readonly_dir(root: Path) -> Path:
    """A directory nothing can be created in: ``root/readonly`` without write permission,
    or, for root (whom permission bits do not stop), a directory of sysfs."""
    if os.geteuid() == 0 and os.path.isdir("/sys/kernel"):
        return Path("/sys/kernel")
    ro = root / "readonly"
    ro.mkdir(exist_ok=True)
    ro.chmod(0o555)
    return ro


def fixtures(root: Path) -> Path:
    """Write the fixtures in ``root``; the read-only directory the cases write to."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "adir").mkdir(exist_ok=True)
    (root / "empty.json").write_bytes(b"")
    (root / "latin1.json").write_bytes(b'{"kind": "caf\xe9"}')
    (root / "broken.json").write_text('{"devices": [')
    (root / "list.json").write_text("[1, 2, 3]")
    (root / "afile").write_text("a file, not a directory\n")
    (root / "devices-shape.json").write_text('{"devices": 5}')
    (root / "devices-item.json").write_text('{"devices": [{"name": "/gpu:0"}, "gpu1"]}')
    (root / "devices-many.json").write_text(json.dumps(
        {"devices": [{"name": f"/gpu:{k}"} for k in range(65)]}))
    (root / "costs-version.json").write_text('{"schema_version": 7}')
    (root / "costs-shape.json").write_text(json.dumps(
        {"schema_version": 1, "compute": [], "comm": {}, "memory": {}}))
    (root / "garbage.pb").write_bytes(bytes(range(256)) * 4)
    (root / "state-schema.json").write_text('{"schema": "other"}')
    (root / "state-workers.json").write_text(
        '{"schema": "fastt.local-cluster", "workers": {"0": 1}}')
    (root / "state-worker.json").write_text(
        '{"schema": "fastt.local-cluster", "workers": [{"index": 0, "address": "a:1", '
        '"pid": "12", "started": 1, "cores": [0], "log": "x"}]}')
    _dumps(root)
    return readonly_dir(root)


def _dumps(root: Path) -> None:
    """``root/dump-<what>``: a strategy dump whose file ``what`` is broken (copied from a
    valid dump planned without TensorFlow)."""
    good = root / "dump-good"
    if not (good / "strategy-1" / "strategy.json").exists():
        _plan_dump(good)
    bad = {"strategy-latin1": ("strategy.json", b"\xff\xfe{}"),
           "strategy-list": ("strategy.json", b"[]"),
           "strategy-empty": ("strategy.json", b""),
           "trace-list": ("predicted_trace.json", b"[]"),
           "trace-shape": ("predicted_trace.json", b'{"traceEvents": 5}'),
           "trace-broken": ("predicted_trace.json", b'{"traceEvents": ['),
           "trace-latin1": ("predicted_trace.json", b'{"a": "\xe9"}')}
    for name, (file, data) in bad.items():
        d = root / f"dump-{name}" / "strategy-1"
        d.mkdir(parents=True, exist_ok=True)
        for f in (good / "strategy-1").iterdir():
            (d / f.name).write_bytes(f.read_bytes())
        (d / file).write_bytes(data)
    d = root / "dump-report-dir" / "strategy-1"  # report.html a directory: not writable
    d.mkdir(parents=True, exist_ok=True)
    (d / "strategy.json").write_bytes((good / "strategy-1" / "strategy.json").read_bytes())
    (d / "report.html").mkdir(exist_ok=True)


def _plan_dump(out: Path) -> None:
    from fastt import plan_cmd
    from fastt.sched.sim.device_spec import parse
    from fastt.sched.strategy import plan
    from tests.helpers import training_graph
    from tests.helpers import costs
    ds, g = parse("2xV100"), training_graph(B=16)
    setup = plan_cmd.Setup(g, "2xV100", ds, ["update", "loss"], costs(ds, g))
    s = plan(g, ds.devices, setup.costs, "m-topo", fetches=["update", "loss"])
    plan_cmd.write_dumps(str(out), setup, [s])


def _reading(kind: str, command: list[str], option: str, what: str, label: str,
             skip: tuple[str, ...] = ()) -> list[Case]:
    """``command`` with ``option`` (``""``: the last argument of ``command`` takes the
    file) given each bad file but those of ``skip``."""
    out = []
    for name, wrong in BAD_FILES.items():
        if name in skip:
            continue
        arg = f"{{root}}/{name}"
        argv = [*command, *([option] if option else []), arg]
        head = "-".join(command[:2]) if command[0] == "cluster" else command[0]
        out.append(Case(f"{head}-{label}-{name.split('.')[0]}", kind, tuple(argv),
                        (what, arg, wrong)))
    return out


PLAN = ["plan", "--model", "small_cnn", "--devices", "2xV100"]
DEVICES = "device file"
COSTS = "cost-model file"
STATE = "cluster state file"

CLUSTER_SKIP = ("missing.json",)  # no state file: no cluster recorded, not an error

CASES: list[Case] = [
    # files read
    *_reading("files", ["plan", "--model", "small_cnn", "--devices"], "", DEVICES, "devices"),
    *_reading("files", ["compare", "--model", "small_cnn", "--devices"], "", DEVICES,
              "devices"),
    *_reading("files", PLAN, "--costs", COSTS, "costs"),
    *_reading("files", ["compare", "--model", "small_cnn", "--devices", "2xV100"], "--costs",
              COSTS, "costs"),
    *_reading("files", ["cluster", "status"], "--state", STATE, "state", CLUSTER_SKIP),
    *_reading("files", ["cluster", "down"], "--state", STATE, "state", CLUSTER_SKIP),
    *_reading("files", ["cluster", "up", "--workers", "1"], "--state", STATE, "state",
              CLUSTER_SKIP),
    Case("plan-devices-shape", "files", ("plan", "--model", "small_cnn", "--devices",
                                         "{root}/devices-shape.json"),
         (DEVICES, "{root}/devices-shape.json", "TypeError")),
    Case("plan-devices-item", "files", ("plan", "--model", "small_cnn", "--devices",
                                        "{root}/devices-item.json"),
         (DEVICES, "{root}/devices-item.json", "TypeError")),
    Case("plan-devices-too-many", "files", ("plan", "--model", "small_cnn", "--devices",
                                            "{root}/devices-many.json"),
         ("--devices", "{root}/devices-many.json", "65 devices", "the 64 ")),
    Case("plan-costs-version", "files", (*PLAN, "--costs", "{root}/costs-version.json"),
         (COSTS, "{root}/costs-version.json", "schema_version")),
    Case("plan-costs-shape", "files", (*PLAN, "--costs", "{root}/costs-shape.json"),
         (COSTS, "{root}/costs-shape.json", "$.compute")),
    Case("plan-graph-missing", "files", ("plan", "{root}/missing.pb", "--devices", "2xV100"),
         ("graph file", "{root}/missing.pb", "does not exist")),
    Case("plan-graph-dir", "files", ("plan", "{root}/adir", "--devices", "2xV100"),
         ("graph file", "{root}/adir", "is a directory")),
    Case("plan-graph-empty", "files", ("plan", "{root}/empty.json", "--devices", "2xV100"),
         ("graph file", "{root}/empty.json", "is empty")),
    Case("plan-graph-garbage", "files", ("plan", "{root}/garbage.pb", "--devices", "2xV100"),
         ("{root}/garbage.pb", "is not a TensorFlow GraphDef"), tensorflow=True),
    Case("cluster-status-state-schema", "files",
         ("cluster", "status", "--state", "{root}/state-schema.json"),
         (STATE, "{root}/state-schema.json", "schema 'other'")),
    Case("cluster-status-state-workers", "files",
         ("cluster", "status", "--state", "{root}/state-workers.json"),
         (STATE, "{root}/state-workers.json", "'workers' is an object")),
    Case("cluster-down-state-worker", "files",
         ("cluster", "down", "--state", "{root}/state-worker.json"),
         (STATE, "{root}/state-worker.json", "workers[0].pid is a string")),
    Case("inspect-missing", "files", ("inspect", "{root}/missing"),
         ("{root}/missing", "is not a directory")),
    Case("inspect-file", "files", ("inspect", "{root}/afile"),
         ("{root}/afile", "is not a directory")),
    Case("inspect-no-dumps", "files", ("inspect", "{root}/adir"),
         ("{root}/adir", "no strategy dumps")),
    Case("verify-missing", "files", ("verify", "{root}/missing.py"),
         ("{root}/missing.py", "no such file")),
    Case("verify-a-directory", "files", ("verify", "{root}/adir"),
         ("{root}/adir", "is not a file")),
    Case("report-no-dumps", "files", ("report", "{root}/adir"),
         ("{root}/adir", "no strategy dumps")),
    *[Case(f"{cmd}-dump-{name}", "files", (cmd, f"{{root}}/dump-{name}"),
           (f"{{root}}/dump-{name}/strategy-1/{file}", wrong))
      for cmd in ("inspect", "report") for name, file, wrong in (
          ("strategy-latin1", "strategy.json", "is not UTF-8"),
          ("strategy-list", "strategy.json", "holds an array"),
          ("strategy-empty", "strategy.json", "is empty"),
          ("trace-list", "predicted_trace.json", "holds an array"),
          ("trace-shape", "predicted_trace.json", "trace schema"),
          ("trace-broken", "predicted_trace.json", "is not JSON"),
          ("trace-latin1", "predicted_trace.json", "is not UTF-8"))],
    # output locations
    *[Case(f"{cmd}-{option.strip('-')}-{where}", "outputs", (*args, option, path),
           (option, path, wrong))
      for cmd, args, option in (("plan", PLAN, "--json"), ("plan", PLAN, "--dump"),
                                ("compare", ["compare", *PLAN[1:]], "--dump"),
                                ("demo", ["demo"], "--out"))
      for where, path, wrong in (
          ("under-a-file", "{root}/afile/out", "is not a directory"),
          ("read-only", "{ro}/fastt-out", "cannot write"),
          ("missing-parent" if option == "--json" else "a-file",
           "{root}/missing/out.json" if option == "--json" else "{root}/afile",
           "does not exist" if option == "--json" else "is not a directory"))],
    Case("verify-json-under-a-file", "outputs",
         ("verify", "--json", "{root}/afile/out.json", "{root}/afile"),
         ("--json", "{root}/afile/out.json", "is not a directory")),
    Case("plan-json-a-directory", "outputs", (*PLAN, "--json", "{root}/adir"),
         ("--json", "{root}/adir", "is a directory")),
    Case("cluster-up-state-under-a-file", "outputs",
         ("cluster", "up", "--workers", "1", "--state", "{root}/afile/state.json"),
         (STATE, "{root}/afile/state.json", "is not a directory")),
    Case("cluster-up-state-read-only", "outputs",
         ("cluster", "up", "--workers", "1", "--state", "{ro}/fastt-state/state.json"),
         (STATE, "{ro}/fastt-state/state.json", "cannot write")),
    Case("report-report-html-a-directory", "outputs", ("report", "{root}/dump-report-dir"),
         ("report", "{root}/dump-report-dir/strategy-1/report.html", "Is a directory")),
    # values
    *[Case(f"plan-batch-size={v}", "values", (*PLAN, "--batch-size", v),
           ("--batch-size", f"'{v}'", ">= 1")) for v in ("-4", "0", "x")],
    Case("plan-batch-size-with-a-file", "values",
         ("plan", "{root}/garbage.pb", "--devices", "2xV100", "--batch-size", "8"),
         ("--batch-size 8", "graph file")),
    Case("plan-graph-and-model", "values",
         ("plan", "{root}/garbage.pb", "--model", "small_cnn", "--devices", "2xV100"),
         ("{root}/garbage.pb", "--model 'small_cnn'", "not both")),
    Case("verify-devices", "values", ("verify", "--devices", "tpu:9", "{root}/afile"),
         ("--devices", "'tpu:9'")),
    Case("plan-no-graph", "values", ("plan", "--devices", "2xV100"), ("--model",)),
    *[Case(f"plan-bucket-mb={v}", "values", (*PLAN, "--bucket-mb", v),
           ("--bucket-mb", f"'{v}'")) for v in ("-1", "nan", "inf")],
    Case("plan-devices-spec", "values", ("plan", "--model", "small_cnn", "--devices", "2xTPU9"),
         ("'2xTPU9'", "unknown kind")),
    Case("plan-devices-zero", "values", ("plan", "--model", "small_cnn", "--devices", "0xV100"),
         ("'0xV100'", "at least one device")),
    # more devices than fastt plans over: named before anything is built
    Case("plan-devices-too-many-spec", "values",
         ("plan", "--model", "small_cnn", "--devices", "10000xV100", "--budget", "10"),
         ("--devices", "'10000xV100'", "10000 devices", "the 64 ")),
    Case("compare-devices-too-many-servers", "values",
         ("compare", "--model", "small_cnn", "--devices", "2x40xV100"),
         ("--devices", "'2x40xV100'", "80 devices", "the 64 ")),
    Case("demo-steps-0", "values", ("demo", "--steps", "0"), ("--steps", "'0'")),
    Case("inspect-top-0", "values", ("inspect", "{root}/adir", "--top", "0"), ("--top", "'0'")),
    Case("cluster-workers-0", "values", ("cluster", "up", "--workers", "0"),
         ("--workers", "'0'")),
    Case("cluster-port-high", "values",
         ("cluster", "up", "--workers", "2", "--port", "65535", "--state",
          "{root}/state-new.json"), ("--port 65535", "65536")),
    Case("worker-cluster-hello", "values", ("worker", "--cluster", "hello", "--index", "0"),
         ("--cluster 'hello'", "host:port")),
    Case("worker-cluster-port", "values",
         ("worker", "--cluster", "127.0.0.1:99999", "--index", "0"),
         ("--cluster '127.0.0.1:99999'",)),
    Case("worker-index", "values",
         ("worker", "--cluster", "127.0.0.1:2222", "--index", "3"), ("--index 3",)),
    Case("worker-index-negative", "values",
         ("worker", "--cluster", "127.0.0.1:2222", "--index", "-1"), ("--index", "'-1'")),
    Case("worker-job", "values",
         ("worker", "--cluster", "127.0.0.1:2222", "--index", "0", "--job", "my job"),
         ("--job", "'my job'", "job name")),
    Case("worker-threads", "values",
         ("worker", "--cluster", "127.0.0.1:2222", "--index", "0", "--threads", "0"),
         ("--threads", "'0'")),
    # one device: a trivial plan; data parallelism needs two
    Case("plan-one-device-data-parallel", "devices",
         ("plan", "--model", "small_cnn", "--devices", "1xV100", "--strategy", "data-parallel"),
         ("data-parallel", "at least 2 devices", "1 given"), tensorflow=True),
    Case("plan-one-device", "devices",
         ("plan", "--model", "small_cnn", "--devices", "1xV100", "--budget", "5"),
         ("data-parallel", "at least 2 devices"), tensorflow=True, ok=True),
    Case("compare-one-device", "devices",
         ("compare", "--model", "small_cnn", "--devices", "1xV100", "--budget", "5"),
         ("data-parallel", "at least 2 devices"), tensorflow=True, ok=True),
]


def problems(case: Case, code: int, out: str, err: str, root: Path, ro: Path) -> list[str]:
    """What is wrong with a run of ``case``: a traceback; for an error, not exit code 2, not
    exactly one ``fastt: error:`` line, not last, or one that leaves out a culprit; for a
    success, not exit code 0 or an output that leaves out a culprit."""
    found = []
    if "Traceback" in err:
        found.append("a Python traceback on stderr")
    names = case.names(root, ro)
    if case.ok:
        if code != 0:
            found.append(f"exit code {code}, expected 0")
        found += [f"the output does not name {n!r}" for n in names if n not in out]
        return found
    if code != 2:
        found.append(f"exit code {code}, expected 2")
    lines = err.splitlines()
    errors = [x for x in lines if x.startswith("fastt: error:")]
    if len(errors) != 1:
        found.append(f"{len(errors)} 'fastt: error:' lines on stderr, expected 1")
    elif lines[-1] != errors[0]:
        found.append("the 'fastt: error:' line is not the last line of stderr")
    found += [f"the error does not name {n!r}" for n in names
              if not any(n in x for x in errors)]
    return found
