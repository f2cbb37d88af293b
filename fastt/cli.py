"""The ``fastt`` command."""
from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from dataclasses import replace
from typing import Any, NoReturn

from fastt import __version__
from fastt.errors import FasttError
from fastt.jsonio import check_output, writing


def _demo(args: argparse.Namespace) -> int:
    check_output(args.out, "--out directory", directory=True)
    from fastt import demo
    with writing(args.out, "--out directory"):
        result = demo.run(out_dir=args.out, steps=args.steps)
    print(result.summary())
    return 0


def _progress(what: str) -> Any:
    """A progress callback that says ``what`` it is doing to each name, on stderr."""
    def say(name: str) -> None:
        print(f"  {what + ' ' if what else ''}{name}...", file=sys.stderr, flush=True)
    return say


def _plan(args: argparse.Namespace) -> int:
    from fastt import plan_cmd
    from fastt.sched.sim.device_spec import parse as parse_devices
    from fastt.sched.search.osdpos import clock
    began = clock()
    # every input and output checked before the graph is loaded and planned
    if getattr(args, "fit", False) and not args.model:
        raise FasttError("--fit plans the model at other batch sizes: give --model NAME (a "
                         "graph file has its own batch)")
    plan_cmd.check_graph(args.graph, args.model, args.batch_size)
    device_set = parse_devices(args.devices)
    models = plan_cmd.read_costs(args.costs)
    if getattr(args, "json", None):
        check_output(args.json, "--json file")
    if args.dump:
        check_output(args.dump, "--dump directory", directory=True)
    # A command that ends when the plan is out: what it frees goes by reference counting.
    # The cyclic collector's passes over the graphs' millions of objects took seconds
    # (ResNet-200: 2.8 s while loading, 1.5 s for the first pass after planning).
    if args.device_memory_mb is not None:
        device_set.devices = [replace(d, memory=args.device_memory_mb * 2 ** 20)
                              for d in device_set.devices]
    if getattr(args, "fit", False):
        return _fit(args, device_set, models, began)
    gc.disable()
    n = len(device_set.devices)
    print(f"loading {args.model or args.graph} and its costs over {n} "
          f"device{'s' * (n != 1)}...", file=sys.stderr, flush=True)
    graph = plan_cmd.load(args.graph, args.model, args.batch_size)
    costs = args.costs if models is None else models
    setup = plan_cmd.prepare(graph, args.devices, costs, args.fetch or (), args.bucket_mb,
                             args.transfer_priorities, began + args.budget, device_set)
    compare = args.command == "compare"
    print(f"planning {'every strategy' if compare else args.strategy}...", file=sys.stderr,
          flush=True)
    chosen, others = plan_cmd.plan_all(setup, args.strategy, progress=_progress("planning"),
                                       stage=_progress(""))
    print((plan_cmd.compare if compare else plan_cmd.report)(graph, args.devices, chosen,
                                                             others))
    if getattr(args, "json", None):
        plan_cmd.write_json(args.json, chosen, others)
        print(f"strategy written to {args.json}")
    if args.dump:
        planned = [chosen] + ([s for s in others.values() if not isinstance(s, str)]
                              if compare else [])
        print(f"writing {len(planned)} dump(s) in {args.dump}...", file=sys.stderr, flush=True)
        with writing(args.dump, "--dump directory"):
            paths = plan_cmd.write_dumps(args.dump, setup, planned, _progress("dumping"))
        print("dumps: " + ", ".join(paths))
    return 0


def _fit(args: argparse.Namespace, device_set: Any, models: Any, began: float) -> int:
    """``fastt plan --fit``: each strategy's largest batch that fits (``fastt.fit_cmd``)."""
    from fastt import fit_cmd, plan_cmd
    from fastt.passes.data_parallel import batch_size
    from fastt.sched.registry import names
    from fastt.sched.search.osdpos import clock
    costs = args.costs if models is None else models

    def setup_at(b: int) -> Any:
        print(f"planning at a batch of {b}...", file=sys.stderr, flush=True)
        return plan_cmd.prepare(plan_cmd.load(None, args.model, b), args.devices, costs,
                                args.fetch or (), args.bucket_mb, args.transfer_priorities,
                                clock() + args.budget, device_set)
    batch = args.batch_size or batch_size(plan_cmd.load(None, args.model, None))
    order = [args.strategy] + [n for n in names() if n != args.strategy]
    fits = fit_cmd.largest_batches(setup_at, order, batch, len(device_set.devices))
    memory = device_set.devices[0].memory
    held = "unbounded memory" if memory == float("inf") else \
        f"{memory / 2 ** 30:.1f} GiB" if memory >= 2 ** 30 else f"{memory / 2 ** 20:.1f} MiB"
    print(f"{args.model} on {args.devices} ({len(device_set.devices)} devices, {held} "
          f"each), searched from a batch of {batch} in {clock() - began:.0f} s\n")
    print(fit_cmd.table(fits))
    return 0


def _cache(args: argparse.Namespace) -> int:
    from fastt.plugin.cache import PlanCache, default_dir
    root = args.dir or os.environ.get("FASTT_CACHE_DIR", "").strip() or default_dir()
    c = PlanCache(root)
    if args.action == "clear":
        n = c.clear()
        print(f"removed {n} plan{'s' * (n != 1)} from {root}")
        return 0
    rows = list(c.entries())
    if not rows:
        print(f"no plans in {root}")
        return 0
    print(f"{len(rows)} plan{'s' * (len(rows) != 1)} in {root}:")
    for key, doc in sorted(rows, key=lambda r: r[1].get("stored", 0.0)):
        speedup = doc.get("speedup")
        kept = doc.get("strategy_name", "?") if doc.get("strategy") is not None else \
            "the original graph (no plan measured faster)"
        print(f"  {key}  {doc.get('script', '?')}  {len(doc.get('devices', []))} devices  "
              f"{kept}" + (f"  {speedup:.2f}x" if isinstance(speedup, float) and
                           doc.get("strategy") is not None else ""))
    return 0


def _verify(args: argparse.Namespace) -> int:
    from fastt import verify_cmd
    if args.json:
        check_output(args.json, "--json file")
    if args.devices:
        from fastt.plugin.settings import parse_devices
        try:
            parse_devices(args.devices)
        except FasttError as e:
            raise FasttError(f"--devices: {e}") from None
    return verify_cmd.run(args.script, args.args, args.devices, args.json, args.all)


def _inspect(args: argparse.Namespace) -> int:
    from fastt.inspect import dumps, summary
    declined = dumps.find_declined(args.dir)
    try:
        found = dumps.find(args.dir)
    except dumps.DumpError:
        if not declined:
            raise
        found = []
    print(summary.format_dumps(args.dir, found, top=args.top, declined=declined))
    return 0


def _report(args: argparse.Namespace) -> int:
    from fastt.inspect import dumps, report
    from fastt.inspect.schema import DumpError
    found = dumps.find(args.dir)
    for k, d in enumerate(found, 1):
        print(f"  rendering {d.name} ({k}/{len(found)})...", file=sys.stderr, flush=True)
        with writing(os.path.join(d.path, "report.html"), "report", DumpError):
            print(report.write(d.path))
    return 0


def _worker(args: argparse.Namespace) -> int:
    from fastt.cluster import worker
    worker.addresses(args.cluster, args.index, args.job, args.threads)
    return worker.main(["--cluster", args.cluster, "--index", str(args.index), "--job", args.job,
                        "--threads", str(args.threads)])


def _cluster(args: argparse.Namespace) -> int:
    from fastt.cluster import launcher
    path = launcher.state_path(args.state)
    if args.action == "up":
        def starting() -> None:
            print(f"starting {args.workers} workers on 127.0.0.1...", file=sys.stderr,
                  flush=True)
        spec = launcher.up(args.workers, args.cores_per_worker, args.port, path,
                           starting=starting)
        print(f"cluster up on 127.0.0.1, serving this user's connections only; state in "
              f"{path}; point training at it with:", file=sys.stderr)
        print(f"FASTT_CLUSTER={spec}")
    elif args.action == "kill":
        if args.worker is None:
            raise FasttError("fastt cluster kill needs the worker's index, e.g. "
                             "'fastt cluster kill 1'")
        w = launcher.kill(args.worker, args.signal.upper().removeprefix("SIG"), path)
        print(f"sent SIG{args.signal.upper().removeprefix('SIG')} to worker {w.index} "
              f"{w.address} pid {w.pid}")
    elif args.action == "restart":
        if args.worker is None:
            raise FasttError("fastt cluster restart needs the worker's index, e.g. "
                             "'fastt cluster restart 1'")
        w = launcher.restart(args.worker, path)
        print(f"restarted worker {w.index} {w.address} pid {w.pid}")
    elif args.action == "down":
        stopped = launcher.down(path)
        print(f"stopped {len(stopped)} worker(s)" + "".join(
            f"\n  worker {w.index} {w.address} pid {w.pid}" for w in stopped))
    else:
        rows = launcher.status(path)
        if not rows:
            print(f"no local cluster recorded in {path}")
            return 1
        for w, state in rows:
            print(f"worker {w.index}  {w.address}  pid {w.pid}  cores {w.cores}  {state}")
        return 0 if all(s.startswith("answering") for _, s in rows) else 1
    return 0


class _Parser(argparse.ArgumentParser):
    """A parser whose errors are one line, like fastt's own: ``fastt: error: ...``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"fastt: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="fastt",
        description="Automatic placement, ordering and splitting of TensorFlow graph-mode "
                    "training (the FastT system). 'fastt plan' computes a strategy for a "
                    "training graph and compares it with the baselines.")
    parser.add_argument("--version", action="version", version=f"fastt {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("demo", help="profile a small CNN on 2 logical CPU devices and print "
                                    "its cost models")
    p.add_argument("--out", default="fastt-demo-out", help="output directory")
    p.add_argument("--steps", type=_positive, default=5, help="profiled steps (default 5)")
    p.set_defaults(func=_demo)

    from fastt.sched.registry import DEFAULT, KINDS, names
    p = sub.add_parser("plan", help="compute a strategy for a training graph; compare it with "
                                    "every baseline")
    _graph_arguments(p)
    p.add_argument("--strategy", default=DEFAULT, choices=names(), type=str.lower,
                   help="; ".join(f"{k.name}: {k.summary}" for k in KINDS.values()))
    p.add_argument("--json", help="write the strategy as JSON (schema: "
                   "docs/dumps-and-inspection.md)")
    p.add_argument("--dump", metavar="DIR", help="write the strategy's dump (strategy-<k>/: "
                                                 "document, predicted trace, graph, report)")
    p.add_argument("--fit", action="store_true",
                   help="with --model: per strategy, the largest batch whose plan fits the "
                        "devices' memory and its step time (plans the model at each batch "
                        "tried, --budget each)")
    p.set_defaults(func=_plan)

    p = sub.add_parser("compare", help="compute every strategy for a training graph and show "
                                       "them side by side")
    _graph_arguments(p)
    p.add_argument("--dump", metavar="DIR", help="write a dump (strategy-<k>/) per strategy")
    p.set_defaults(func=_plan, strategy=DEFAULT)

    p = sub.add_parser("verify", help="run a training script under fastt and check each "
                       "strategy's first step against the original graph's, value by value")
    p.add_argument("script", help="the training script, run unchanged as python SCRIPT ARGS")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    p.add_argument("--devices", help="FASTT_DEVICES for the run (default: the environment's, "
                                     "else cpu:2)")
    p.add_argument("--json", help="write every check, tensor by tensor, as JSON")
    p.add_argument("--all", action="store_true", help="list every tensor compared")
    p.set_defaults(func=_verify)

    p = sub.add_parser("inspect", help="summarize strategy dumps (FASTT_DUMP_DIR or "
                                       "'compare --dump'): strategies, step times, splits")
    p.add_argument("dir", help="a dump directory, or one strategy-<k> in it")
    p.add_argument("--top", type=_positive, default=5, help="splits listed per strategy")
    p.set_defaults(func=_inspect)

    p = sub.add_parser("report", help="write (or refresh) report.html in every strategy dump")
    p.add_argument("dir", help="a dump directory, or one strategy-<k> in it")
    p.set_defaults(func=_report)

    p = sub.add_parser("cluster", help="a local TensorFlow cluster: worker processes on "
                                       "127.0.0.1, each pinned to its own cores")
    p.add_argument("action", choices=("up", "down", "status", "kill", "restart"))
    p.add_argument("worker", nargs="?", type=int,
                   help="kill, restart: the index of the worker")
    p.add_argument("--signal", default="KILL",
                   help="kill: KILL (default: the worker is lost), STOP (it stops answering), "
                        "CONT (it resumes) or TERM")
    p.add_argument("--workers", type=_positive, default=2, help="workers to start (default 2)")
    p.add_argument("--cores-per-worker", type=_positive, default=1,
                   help="cores each worker is pinned to, and its intra-op threads (default 1)")
    p.add_argument("--port", type=_positive, help="first port (default: free ports)")
    p.add_argument("--state", help="state file (default $FASTT_CLUSTER_STATE or "
                                   "~/.local/state/fastt/cluster.json)")
    p.set_defaults(func=_cluster)

    p = sub.add_parser("cache", help="list or clear the plan cache: the strategies runs kept, "
                       "which the next run of the same training step starts from")
    p.add_argument("action", choices=["list", "clear"])
    p.add_argument("--dir", help="the cache directory (default: FASTT_CACHE_DIR, else "
                   "$XDG_CACHE_HOME/fastt or ~/.cache/fastt)")
    p.set_defaults(func=_cache)

    p = sub.add_parser("worker", help="run one TensorFlow gRPC server of a cluster")
    p.add_argument("--cluster", required=True, help="host:port,host:port,... in task order")
    p.add_argument("--index", type=_index, required=True, help="this worker's task index")
    p.add_argument("--job", default="worker", help="job name (default: worker)")
    p.add_argument("--threads", type=_positive, default=1, help="intra-op threads")
    p.set_defaults(func=_worker)
    return parser


def _graph_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments ``plan`` and ``compare`` share: the graph, devices and costs."""
    p.add_argument("graph", nargs="?", help="GraphDef or MetaGraphDef file of a training graph")
    p.add_argument("--model", help="instead of a file: a model of the zoo (e.g. vgg_19)")
    p.add_argument("--batch-size", type=_positive, help="batch size of --model")
    p.add_argument("--devices", required=True,
                   help="4xV100, 8xV100:pcie, 8xV100:dgx1, 16xV100:nvswitch, 2x4xV100 (two "
                        "servers) or a JSON device file")
    p.add_argument("--costs", default="calibrated",
                   help="'calibrated' (the default: TensorFlow's estimator for the device "
                        "kind, fitted per op class to published V100 measurements), "
                        "'analytical' (the estimator as it is) or a cost model JSON file "
                        "written by fastt")
    p.add_argument("--fetch", action="append", help="op a training step runs (default: the "
                                                    "MetaGraphDef's train_op collection)")
    p.add_argument("--bucket-mb", type=_megabytes, default=25.0,
                   help="gradient bucket of data parallelism's ring all-reduce (default 25; "
                        "0: each gradient on its own)")
    p.add_argument("--transfer-priorities", choices=("auto", "on", "off"), default="auto",
                   type=str.lower,
                   help="send the weights a step reads from another device in the order "
                        "their consumers need them: where the simulator predicts it faster "
                        "(auto, the default), always, or never")
    p.add_argument("--device-memory-mb", type=_megabytes, metavar="MB",
                   help="the memory of every device (default: the device kind's, a V100's "
                        "16 GiB; a JSON device file's own)")
    p.add_argument("--budget", type=_seconds, default=60.0, metavar="SECONDS",
                   help="the time planning should take, graph loading included (default 60): "
                        "the searches for hybrid plans and splits take shares of what is "
                        "left; the data-parallel layouts, the placers and their replays are "
                        "never cut")


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return v


def _index(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 0")
    return v


def _amount(unit: str) -> Any:
    """An argparse type: a finite number of ``unit`` >= 0."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = -1.0
        if not v >= 0 or v == float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of {unit} >= 0")
        return v
    return parse


_megabytes, _seconds = _amount("megabytes"), _amount("seconds")


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
