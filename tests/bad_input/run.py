"""Run every bad input of ``cases.py`` as a user would (``fastt ...`` in a subprocess) and
write a plain-text transcript: the command, its exit code, its stderr (and, for the runs
that succeed, its stdout).

    python tests/bad_input/run.py [--out tests/bad_input/transcript.txt] [--no-tensorflow]
                                  [-k ID] [--in-process]

Exit code 1 when a run shows a Python traceback or does not end as its case expects.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import io
import os
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.bad_input.cases import CASES, Case, fixtures, problems  # noqa: E402


def environment() -> dict[str, str]:
    """This environment without fastt's variables, running this checkout's fastt."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FASTT") and k != "TF_CONFIG"}
    env.update(PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    return env


def run(case: Case, root: Path, ro: Path, timeout: float = 300.0
        ) -> tuple[int, str, str, float]:
    """(exit code, stdout, stderr, seconds) of ``fastt`` run with the case's arguments."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "fastt.cli", *case.args(root, ro)], cwd=ROOT,
                       env={**environment(), **case.env}, capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr, time.perf_counter() - t0


def run_in_process(case: Case, root: Path, ro: Path) -> tuple[int, str, str, float]:
    """The same through ``fastt.cli.main`` in this process (much faster: no interpreter
    start, the modules imported once); an exception that escapes it is printed on the
    captured stderr with its traceback, as the interpreter would print it."""
    from fastt.cli import main as fastt
    out, err = io.StringIO(), io.StringIO()
    collecting = gc.isenabled()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = fastt(case.args(root, ro))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except Exception:  # noqa: BLE001 - shown as a subprocess would show it
            traceback.print_exc()
            code = 1
        finally:
            if collecting:  # 'fastt plan' turns the collector off for its process
                gc.enable()
    return code, out.getvalue(), err.getvalue(), time.perf_counter() - t0


def entry(case: Case, code: int, out: str, err: str, root: Path, ro: Path,
          found: list[str]) -> str:
    """The transcript's lines for one run, the fixtures' paths shortened."""
    def short(text: str) -> str:
        return text.replace(str(root), "<fixtures>").replace(str(ro), "<read-only>")
    command = "fastt " + " ".join(shlex.quote(a) for a in case.args(root, ro))
    lines = [f"## {case.id} ({case.kind})", f"$ {short(command)}", f"exit code: {code}",
             "stderr:"] + [f"  {short(x)}" for x in err.splitlines()]
    if case.ok:
        lines += ["stdout:"] + [f"  {short(x)}" for x in out.splitlines()]
    lines.append("check: " + ("; ".join(found) if found else "ok"))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="transcript file (default: stdout only)")
    parser.add_argument("--no-tensorflow", action="store_true",
                        help="leave out the cases that import TensorFlow")
    parser.add_argument("-k", dest="match", default="",
                        help="only the cases whose id contains this")
    parser.add_argument("--in-process", action="store_true",
                        help="call fastt.cli.main in this process instead (a quick check)")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not (args.no_tensorflow and c.tensorflow)
             and args.match in c.id]
    failed = 0
    with tempfile.TemporaryDirectory(prefix="fastt-bad-input-") as tmp:
        root = Path(tmp) / "fixtures"
        ro = fixtures(root)
        parts = [f"# fastt bad-input transcript: {len(cases)} runs of "
                 "tests/bad_input/cases.py (python tests/bad_input/run.py)\n"]
        for case in cases:
            code, out, err, seconds = (run_in_process if args.in_process else run)(
                case, root, ro)
            found = problems(case, code, out, err, root, ro)
            failed += bool(found)
            parts.append(entry(case, code, out, err, root, ro, found))
            print(f"{case.id}: exit {code}, {seconds:.1f} s"
                  + (f": {'; '.join(found)}" if found else ""), file=sys.stderr, flush=True)
    text = "\n".join(parts) + f"\n# {len(cases) - failed} of {len(cases)} as expected\n"
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    else:
        print(text)
    print(f"{len(cases) - failed} of {len(cases)} runs as expected", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
