"""The placed graph of a strategy as Graphviz DOT, and as SVG when Graphviz's ``dot`` is there.

One cluster per device (ops filled with the device's colour, labelled with name and type;
split parts ``X/part{k}`` and fastt's split/concat ops included), data edges solid, control
edges dashed.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess

from fastt import devices as devnames
from fastt.sched.strategy import Strategy

log = logging.getLogger("fastt")
#: one colour per device (matplotlib's tab10, so the graph and the report's charts agree)
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf")
DOT_TIMEOUT_S = 60.0


def color(k: int) -> str:
    return COLORS[k % len(COLORS)]


def _q(*lines: str) -> str:
    """A DOT string of ``lines`` (joined by DOT's line breaks)."""
    return '"' + "\\n".join(t.replace("\\", "\\\\").replace('"', '\\"') for t in lines) + '"'


def to_dot(strategy: Strategy) -> str:
    """DOT text of ``strategy``'s planned graph, ops grouped by the device they run on."""
    index = {d: k for k, d in enumerate(strategy.devices)}
    lines = [f"digraph {_q(strategy.name)} {{",
             f"  graph [rankdir=TB, fontname=Helvetica, label={_q(_title(strategy))}];",
             '  node [shape=box, style="rounded,filled", fontname=Helvetica, fontsize=9];',
             "  edge [color=\"#555555\", arrowsize=0.6];"]
    by_device: dict[str, list[str]] = {d: [] for d in strategy.devices}
    for op in strategy.graph:
        by_device.setdefault(strategy.placement.get(op.name, ""), []).append(op.name)
    for d, names in by_device.items():
        if not names:
            continue
        k = index.get(d)
        cluster, label = (f"cluster_{k}", devnames.short(d)) if k is not None else \
            ("cluster_unplaced", "not placed")
        edge = color(k) if k is not None else "#999999"
        lines.append(f"  subgraph {_q(cluster)} {{")
        lines.append(f"    label={_q(label)}; color={_q(edge)};")
        for name in names:
            lines.append(f"    {_q(name)} [label={_q(name, strategy.graph[name].type)}, "
                         f"fillcolor={_q(edge + '55')}];")
        lines.append("  }")
    edges: dict[tuple[str, str], str] = {}  # one edge per pair: data wins over control
    for op in strategy.graph:
        for c in op.control_inputs:
            edges.setdefault((c, op.name), " [style=dashed]")
        for ref in op.inputs:
            edges[(ref.op, op.name)] = ""
    lines += [f"  {_q(a)} -> {_q(b)}{style};" for (a, b), style in edges.items()
              if a in strategy.graph]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _title(s: Strategy) -> str:
    return (f"{s.name} on {len(s.devices)} devices: {len(s.graph)} ops, {len(s.splits)} splits, "
            f"predicted {1e3 * s.predicted_step_time_s:.3f} ms/step")


def write(strategy: Strategy, directory: str) -> list[str]:
    """Write ``graph.dot`` (and ``graph.svg`` when ``dot`` is on PATH) in ``directory``;
    the paths written."""
    path = os.path.join(directory, "graph.dot")
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_dot(strategy))
    written = [path]
    exe = shutil.which("dot")
    if exe is None:
        return written
    svg = os.path.join(directory, "graph.svg")
    try:
        subprocess.run([exe, "-Tsvg", path, "-o", svg], check=True, capture_output=True,
                       timeout=DOT_TIMEOUT_S)
        written.append(svg)
    except (subprocess.SubprocessError, OSError) as e:
        log.warning("fastt: graphviz could not draw %s (%s); graph.dot is there", path,
                    getattr(e, "stderr", b"")[-200:] or e)
    return written
