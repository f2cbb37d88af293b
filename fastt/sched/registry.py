"""Every strategy fastt computes, by name: the one list the CLI, the session plugin, the
benchmarks and the tests read.

Each is a placer over one interface, a starting graph compiled into a ``Problem`` in and a
``Schedule`` out (``place(problem, start)``), plus where it may start: the model graph, the
data-parallel graph (one replica per device; with mirrored variables and ring all-reduce, or
in TF-slim's parameter-server layout), or all of them (the fastest plan is kept). OS-DPOS is
DPOS from its starting points followed by the split search (``fastt.sched.search.osdpos``), which
``fastt.sched.strategy.plan`` runs when ``search`` is set.

A new strategy is one ``register(StrategyKind(...))`` here and its placer's own module
(``docs/extending.md``); everything that lists strategies reads ``names()`` or ``KINDS``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from fastt.errors import FasttError
from fastt.ir import Graph
from fastt.sched.placers import baselines
from fastt.sched.placers.dpos import dpos
from fastt.sched.placers.exact import exact
from fastt.sched.placers.pipedream import pipedream
from fastt.sched.sim.problem import Problem
from fastt.sched.sim.schedule import Schedule

Place = Callable[[Problem, Graph], Schedule]


@dataclass(frozen=True)
class StrategyKind:
    name: str
    place: Place
    starts: str  # "model", "data-parallel" or "data-parallel-ps" (only), "both", or
    # "micro-batched" (the batch cut into 1, 2 and 4 micro-batches per device)
    search: bool  # OS-DPOS's split search after placing
    summary: str
    starts_search: bool = False  # OS-DPOS also starts from its plan (opted in per placer)
    timed: bool = False  # its placer takes a time limit: place(p, g, seconds)


def _model_only(placer: Callable[[Problem], Schedule]) -> Place:
    return lambda p, _: placer(p)


def _exact(p: Problem, _: Graph, seconds: float | None = None) -> Schedule:
    return exact(p, seconds)


KINDS: dict[str, StrategyKind] = {}
DEFAULT = "os-dpos"  # what the plugin and ``fastt plan`` compute unless told otherwise


def register(k: StrategyKind) -> StrategyKind:
    """Add ``k`` to the registry: ``FASTT_STRATEGY``, ``fastt plan --strategy``, the dump
    schema's strategy names and ``fastt compare`` all read it from here."""
    if k.name != k.name.lower() or not k.name.strip():
        raise ValueError(f"a strategy's name is lower case: {k.name!r}")
    KINDS[k.name] = k
    return k


def names() -> tuple[str, ...]:
    """Every strategy's name, in the registry's order."""
    return tuple(KINDS)


for _k in (
    StrategyKind("single", _model_only(baselines.single), "model", False,
                 "every op on the one device that runs the graph fastest", starts_search=True),
    StrategyKind("data-parallel", baselines.data_parallel, "data-parallel", False,
                 "one replica per device, mirrored variables, ring all-reduce", starts_search=True),
    StrategyKind("data-parallel-ps", baselines.data_parallel, "data-parallel-ps", False,
                 "one replica per device, gradients summed on device 0 (TF-slim's layout, "
                 "device 0 its server)", starts_search=True),
    StrategyKind("dpos", _model_only(dpos), "both", False,
                 "FastT's DPOS: critical path on the fastest device, the rest by EFT",
                 starts_search=True),
    StrategyKind("os-dpos", _model_only(dpos), "both", True,
                 "FastT's OS-DPOS: DPOS, then splits of critical-path ops where they pay",
                 starts_search=True),
    StrategyKind("heft", _model_only(baselines.heft), "model", False,
                 "HEFT (Topcuoglu et al. 2002): mean-cost ranks, earliest finish",
                 starts_search=True),
    StrategyKind("m-topo", _model_only(baselines.m_topo), "model", False,
                 "Baechi's m-TOPO: topological order, devices filled in turn", starts_search=True),
    StrategyKind("m-etf", _model_only(baselines.m_etf), "model", False,
                 "Baechi's m-ETF: the op that can start earliest, memory permitting",
                 starts_search=True),
    StrategyKind("m-sct", _model_only(baselines.m_sct), "model", False,
                 "Baechi's m-SCT: m-ETF, favourite children (SCT's LP) with their parent",
                 starts_search=True),
    StrategyKind("pipedream", pipedream, "micro-batched", False,
                 "PipeDream's stages (replicated where it pays) over micro-batches, GPipe's "
                 "fill and drain, or the earliest micro-batch first", starts_search=True),
    StrategyKind("exact", _exact, "model", False,
                 "NetSplit's MILP (HiGHS): the optimal placement and order of a small graph, "
                 "or the best found and its gap", timed=True),
):
    register(_k)


def kind(name: str) -> StrategyKind:
    """The strategy named ``name``; a ``FasttError`` listing them when there is none."""
    try:
        return KINDS[name]
    except KeyError:
        raise FasttError(f"unknown strategy {name!r}; choose one of "
                         f"{', '.join(names())}") from None


_STARTS = {"model": "the model graph", "data-parallel": "the data-parallel graph",
           "data-parallel-ps": "the data-parallel graph (parameter-server layout)",
           "both": "the model graph and both data-parallel graphs",
           "micro-batched": "the model graph cut into micro-batches"}


def table() -> str:
    """The strategies as docs/strategies.md lists them (Markdown)."""
    rows = ["| name | what it is | starts from | an OS-DPOS start |", "| --- | --- | --- | --- |"]
    for k in KINDS.values():
        name = f"`{k.name}`" + (" (default)" if k.name == DEFAULT else "")
        starts = "every other strategy's starting graph, then the split search" if k.search \
            else _STARTS.get(k.starts, k.starts)
        rows.append(f"| {name} | {k.summary} | {starts} | {'yes' if k.starts_search else 'no'} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
