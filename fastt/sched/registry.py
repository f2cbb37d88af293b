"""Every strategy fastt computes, by name: the one list the CLI, the session plugin, the
benchmarks and the tests read.

Each is a placer over one interface, a starting graph compiled into a ``Problem`` in and a
``Schedule`` out (``place(problem, start)``), plus where it may start: the model graph, the
data-parallel graph (one replica per device; with mirrored variables and ring all-reduce, or
in TF-slim's parameter-server layout), or all of them (the fastest plan is kept). OS-DPOS is
DPOS from its starting points followed by the split search (``fastt.sched.osdpos``), which
``fastt.sched.strategy.plan`` runs when ``search`` is set.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from fastt.errors import FasttError
from fastt.ir import Graph
from fastt.sched import baselines
from fastt.sched.dpos import dpos
from fastt.sched.exact import exact
from fastt.sched.pipedream import pipedream
from fastt.sched.problem import Problem
from fastt.sched.schedule import Schedule

Place = Callable[[Problem, Graph], Schedule]


@dataclass(frozen=True)
class StrategyKind:
    name: str
    place: Place
    starts: str  # "model", "data-parallel" or "data-parallel-ps" (only), "both", or
    # "micro-batched" (the batch cut into 1, 2 and 4 micro-batches per device)
    search: bool  # OS-DPOS's split search after placing
    summary: str
    starts_search: bool = True  # OS-DPOS starts from its plan (not the exact program: its
    # time limit is a strategy of its own)
    timed: bool = False  # its placer takes a time limit: place(p, g, seconds)


def _model_only(placer: Callable[[Problem], Schedule]) -> Place:
    return lambda p, _: placer(p)


def _exact(p: Problem, _: Graph, seconds: float | None = None) -> Schedule:
    return exact(p, seconds)


KINDS: dict[str, StrategyKind] = {k.name: k for k in (
    StrategyKind("single", _model_only(baselines.single), "model", False,
                 "every op on the one device that runs the graph fastest"),
    StrategyKind("data-parallel", baselines.data_parallel, "data-parallel", False,
                 "one replica per device, mirrored variables, ring all-reduce"),
    StrategyKind("data-parallel-ps", baselines.data_parallel, "data-parallel-ps", False,
                 "one replica per device, gradients summed on device 0 (TF-slim's layout, "
                 "device 0 its server)"),
    StrategyKind("dpos", _model_only(dpos), "both", False,
                 "FastT's DPOS: critical path on the fastest device, the rest by EFT"),
    StrategyKind("os-dpos", _model_only(dpos), "both", True,
                 "FastT's OS-DPOS: DPOS, then splits of critical-path ops where they pay"),
    StrategyKind("heft", _model_only(baselines.heft), "model", False,
                 "HEFT (Topcuoglu et al. 2002): mean-cost ranks, earliest finish"),
    StrategyKind("m-topo", _model_only(baselines.m_topo), "model", False,
                 "Baechi's m-TOPO: topological order, devices filled in turn"),
    StrategyKind("m-etf", _model_only(baselines.m_etf), "model", False,
                 "Baechi's m-ETF: the op that can start earliest, memory permitting"),
    StrategyKind("m-sct", _model_only(baselines.m_sct), "model", False,
                 "Baechi's m-SCT: m-ETF, favourite children (SCT's LP) with their parent"),
    StrategyKind("pipedream", pipedream, "micro-batched", False,
                 "PipeDream's stages (replicated where it pays) over micro-batches, GPipe's "
                 "fill and drain, or the earliest micro-batch first"),
    StrategyKind("exact", _exact, "model", False,
                 "NetSplit's MILP (HiGHS): the optimal placement and order of a small graph, "
                 "or the best found and its gap", starts_search=False, timed=True),
)}
STRATEGIES = tuple(KINDS)


def kind(name: str) -> StrategyKind:
    """The strategy named ``name``; a ``FasttError`` listing them when there is none."""
    try:
        return KINDS[name]
    except KeyError:
        raise FasttError(f"unknown strategy {name!r}; choose one of "
                         f"{', '.join(STRATEGIES)}") from None
