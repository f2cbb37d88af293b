"""The simulated testbed: the paper's models on simulated V100s, every strategy side by side.

    python benchmarks/simulated.py [--quick] [--models NAME ...] [--out benchmarks/results]

Per-op times come from TensorFlow's analytical cost estimator (grappler) for a V100,
calibrated per op class against published V100 measurements (``fastt.costs.calibration``,
``benchmarks/grounding.py``); the GPUs of a server are linked as a DGX-1's (its hybrid
cube-mesh of NVLinks, PCIe where a pair has none), servers by 100 Gb/s InfiniBand
(fastt.sched.sim.device_spec). For every model, device set (2, 4, 8 GPUs of a DGX-1; 2 servers
x 4 and x 8) and scaling (strong: one global batch; weak: a fixed batch per GPU), each
strategy is computed (single device, data parallel, DPOS, OS-DPOS, HEFT, m-TOPO, m-ETF, ...)
and its step replayed by the simulator with one transfer at a time per link direction, and
TF-slim's layout as it runs (``data-parallel-ps-cpu``: the parameter server on the host CPU,
``host_ps_step``). Ablations on OS-DPOS: its placement
run first come, first served (no enforced order), and OS-DPOS without splits. Each row also
gets a lower bound on any plan's step time (``fastt.sched.search.bounds``). Writes
simulated.json after each model; with ``--models`` (and not ``--quick``) the rows of those
models replace their rows in an existing full run's simulated.json, the others are kept.
"""
from __future__ import annotations

import logging
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import models as zoo_models  # noqa: E402
from benchmarks.common import cpu_model, previous_full_run, with_row, write_json  # noqa: E402

from fastt.sched.registry import names  # noqa: E402
from fastt.sched.sim.device_spec import HOST_MEMORY_BYTES_PER_S  # noqa: E402

STRONG = ("2xV100:dgx1", "4xV100:dgx1", "8xV100:dgx1", "2x4xV100:dgx1", "2x8xV100:dgx1")
WEAK = ("2xV100:dgx1", "4xV100:dgx1", "8xV100:dgx1", "2x4xV100:dgx1")
QUICK = ("2xV100:dgx1", "4xV100:dgx1")
HOST_PS = "data-parallel-ps-cpu"  # TF-slim's layout as it runs: the server on the host CPU


def gpus(spec: str) -> int:
    parts = [int(p) for p in spec.split(":")[0].split("x")[:-1]]
    return parts[0] * (parts[1] if len(parts) > 1 else 1)


def training_graph(model: zoo_models.Model, batch: int, calibrated: bool = True):
    """The model's IR at ``batch`` and its V100 op times: TensorFlow's analytical estimates,
    calibrated per op class against published measurements unless told not to
    (``fastt.plan_cmd.static_seconds``)."""
    from fastt.plan_cmd import static_seconds
    graph, fetch = model_graph(model, batch)
    return graph, fetch, static_seconds(graph, fetch, "V100", calibrated)


def model_graph(model: zoo_models.Model, batch: int):
    """The model's IR at ``batch`` and its step's fetches (its train op)."""
    import tensorflow as tf

    from fastt.adapters.tf_import import from_tf_graph
    tf.compat.v1.disable_eager_execution()
    built = model.build(batch)
    return from_tf_graph(built.graph, name=model.name), [built.train_op.name]


def contended_step(strategy, ds, costs, graph, fifo: bool) -> float:
    """The strategy's placement in its own order or (``fifo``) with none enforced
    (simulated, link contention)."""
    from fastt.sched.strategy import replay
    return replay(strategy, ds.devices, costs, graph, ds.copy_bytes_per_s,
                  link_concurrency=1, fifo=fifo)[1].makespan


def host_ps_step(ps, ds, seconds, graph, host_bytes_per_s: float = HOST_MEMORY_BYTES_PER_S
                 ) -> float:
    """TF-slim's layout as it runs (``fastt.sched.placers.host_ps``): the data-parallel-ps
    plan ``ps`` with the variables and their updates on the host CPU of ``ds``'s first
    server (``with_host``: PCIe to each GPU, memory-bound ops slower by the ratio of memory
    bandwidths; ``host_bytes_per_s``: the host's, default a DGX-1's), replayed in its order
    with link contention."""
    from dataclasses import replace

    from fastt.costs.source import StaticCosts
    from fastt.sched.placers.host_ps import on_host
    from fastt.sched.sim.device_spec import with_host
    from fastt.sched.strategy import replay
    hds, host, slowdown = with_host(ds, host_bytes_per_s)
    s = replace(ps, placement=on_host(ps.graph, ps.placement, host.name),
                devices=[*ps.devices, host.name])
    costs = StaticCosts(seconds, hds, {host.name: slowdown})
    return replay(s, hds.devices, costs, graph, ds.copy_bytes_per_s,
                  link_concurrency=1)[1].makespan


def case(graph, fetch, seconds, spec: str, batch: int) -> dict:
    """Every strategy and the OS-DPOS ablations on one device set."""
    from fastt.costs.source import StaticCosts
    from fastt.plan_cmd import Setup, plan_each
    from fastt.sched.sim.device_spec import parse
    from fastt.sched.strategy import plan
    ds = parse(spec)
    costs = StaticCosts(seconds, ds)
    row: dict = {"devices": spec, "gpus": gpus(spec), "batch": batch, "strategies": {}}
    planned = {}
    setup = Setup(graph, spec, ds, fetch, costs)  # the strategies share its data-parallel graphs
    for name, s in plan_each(setup, names()).items():
        if isinstance(s, str):
            row["strategies"][name] = {"error": s}
            continue
        planned[name] = s
        row["strategies"][name] = {
            "predicted_s": s.predicted_step_time_s, "simulated_s": s.simulated_step_time_s,
            "samples_per_s": batch / s.simulated_step_time_s, "plan_time_s": s.plan_time_s,
            "dpos_runs": s.dpos_runs, "replicas": s.replicas, "ops": len(s.graph),
            "ops_per_device": list(s.ops_per_device().values()),
            "splits": [sp.details() for sp in s.splits], "kept_whole": s.kept_whole}
    if "data-parallel-ps" in planned:
        t = host_ps_step(planned["data-parallel-ps"], ds, seconds, graph)
        row["strategies"][HOST_PS] = {"simulated_s": t, "samples_per_s": batch / t}
    fastt = planned.get("os-dpos")
    if fastt is not None:
        no_split = plan(graph, ds.devices, costs, "os-dpos", split=False,
                        shared=setup.planning)
        row["ablation"] = {"ordered_s": contended_step(fastt, ds, costs, graph, False),
                           "fifo_s": contended_step(fastt, ds, costs, graph, True),
                           "kept_order": fastt.ordered,
                           "split_s": fastt.simulated_step_time_s,
                           "no_split_s": no_split.simulated_step_time_s}
    bound = setup.planning.bound()
    row["bound"] = {"s": bound.value, "critical_path_s": bound.critical_path,
                    "work_s": bound.work}
    dp = row["strategies"].get("data-parallel", {}).get("simulated_s")
    for r in row["strategies"].values():
        if dp and "simulated_s" in r:
            r["speedup_over_dp"] = dp / r["simulated_s"]
    return row


def bench(model: zoo_models.Model, scalings: dict[str, tuple[str, ...]]) -> dict:
    out: dict = {"model": model.name, "zoo": model.zoo_name, "kwargs": model.kwargs,
                 "rows": []}
    cache: dict[int, tuple] = {}
    for scaling, specs in scalings.items():
        for spec in specs:
            batch = model.batch if scaling == "strong" else model.per_device_batch * gpus(spec)
            if batch not in cache:
                t = time.perf_counter()
                cache.clear()  # one graph in memory at a time
                cache[batch] = training_graph(model, batch)
                out.setdefault("ops", len(cache[batch][0]))
                out.setdefault("graph_s", {})[str(batch)] = time.perf_counter() - t
            t = time.perf_counter()
            row = case(*cache[batch], spec, batch)
            row["scaling"] = scaling
            row["wall_s"] = time.perf_counter() - t
            out["rows"].append(row)
            st = row["strategies"]
            fastt, dp = st.get("os-dpos", {}), st.get("data-parallel", {})
            print(f"{model.name:>12} {scaling:>6} {spec:>9} batch {batch:>4}: os-dpos "
                  f"{1e3 * fastt.get('simulated_s', float('nan')):9.2f} ms, data-parallel "
                  f"{1e3 * dp.get('simulated_s', float('nan')):9.2f} ms, speedup "
                  f"{fastt.get('speedup_over_dp', float('nan')):.3f}x "
                  f"({row['wall_s']:.0f} s)", flush=True)
    return out


def main() -> None:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="three small models, 2 and 4 GPUs")
    ap.add_argument("--models", nargs="*", help="model names (default: all)")
    ap.add_argument("--devices", nargs="*", help="device sets (default: all of the scaling)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.getLogger("fastt").setLevel(logging.ERROR)
    if args.quick:
        models = zoo_models.pick(zoo_models.SIMULATED_QUICK, args.models)
        scalings = {"strong": QUICK, "weak": QUICK}
    else:
        models = zoo_models.pick(zoo_models.SIMULATED, args.models)
        scalings = {"strong": STRONG, "weak": WEAK}
    if args.devices:
        scalings = {k: tuple(d for d in v if d in args.devices) for k, v in scalings.items()}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "simulated.json")
    doc = previous_full_run(path) if args.models and not args.quick and not args.devices \
        else None
    doc = doc or {"meta": {"python": platform.python_version(), "cpu": cpu_model(),
                           "cpus": os.cpu_count(),
                           "quick": args.quick, "strategies": [*names(), HOST_PS],
                           "costs": "calibrated",
                           "metric": "simulated step time, one transfer at a time per link "
                                     "direction"},
                  "models": []}
    doc["meta"]["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    # the registry's strategies, also when rows of an older run are kept (their strategies
    # missing from a row read n/a)
    doc["meta"]["strategies"] = [*names(), HOST_PS]
    order = [m.name for m in zoo_models.SIMULATED]
    for m in models:  # written after each model, with the run it comes from
        doc["models"] = with_row(doc["models"], {**bench(m, scalings),
                                                 "when": doc["meta"]["when"]}, order)
        write_json(path, doc)


if __name__ == "__main__":
    main()
