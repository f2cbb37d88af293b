"""The ``fastt`` command."""
from __future__ import annotations

import argparse
import logging
import os
import sys

from fastt import __version__
from fastt.errors import FasttError


def _demo(args: argparse.Namespace) -> int:
    from fastt import demo
    result = demo.run(out_dir=args.out, steps=args.steps)
    print(result.summary())
    return 0


def _worker(args: argparse.Namespace) -> int:
    from fastt.cluster import worker
    return worker.main(["--cluster", args.cluster, "--index", str(args.index), "--job", args.job,
                        "--threads", str(args.threads)])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastt",
        description="Automatic placement, ordering and splitting of TensorFlow graph-mode "
                    "training. Set FASTT=1 to accelerate an unchanged training script.")
    parser.add_argument("--version", action="version", version=f"fastt {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("demo", help="profile a small CNN on 2 logical CPU devices and print "
                                    "its cost models")
    p.add_argument("--out", default="fastt-demo-out", help="output directory")
    p.add_argument("--steps", type=int, default=5, help="profiled steps (default 5)")
    p.set_defaults(func=_demo)

    p = sub.add_parser("worker", help="run one TensorFlow gRPC server of a cluster")
    p.add_argument("--cluster", required=True, help="host:port,host:port,... in task order")
    p.add_argument("--index", type=int, required=True, help="this worker's task index")
    p.add_argument("--job", default="worker")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads")
    p.set_defaults(func=_worker)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if not args.command:
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except FasttError as e:
        print(f"fastt: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
