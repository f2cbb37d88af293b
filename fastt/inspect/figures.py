"""The report's charts, drawn with matplotlib (no pyplot: the caller's backend is untouched)
and returned as inline SVG.

Identifiable parts carry ids: each Gantt row is ``fastt-gantt-<kind>-row-<k>`` (device ``k``,
kind ``predicted`` or ``measured``), its op bars ``fastt-gantt-<kind>-ops-<k>`` and its
transfers ``fastt-gantt-<kind>-transfers-<k>``. Every other id in a figure's SVG is prefixed
with the figure's name, so several figures can share one HTML page.
"""
from __future__ import annotations

import io
import logging
import math
import re
from typing import Any, Sequence

from fastt import devices as devnames
from fastt.inspect.graphviz import color
from fastt.inspect.trace import Row

log = logging.getLogger("fastt")
MAX_LANES = 6  # lanes drawn per Gantt row; more overlapping ops share the last one
MAX_PAIRS = 12  # device pairs drawn in the communication chart
STATUS_COLORS = {"active": "#2ca02c", "superseded": "#1f77b4", "rolled_back": "#d62728",
                 "failed": "#000000", "measuring": "#ff7f0e", "planned": "#9467bd",
                 "unfinished": "#8c564b"}
_warned = False


def available() -> bool:
    """Whether matplotlib is installed (one warning per process when it is not)."""
    global _warned
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if not _warned:
            _warned = True
            log.warning("fastt: matplotlib is not installed; reports are written without "
                        "charts (pip install matplotlib)")
        return False
    return True


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure
    return Figure(figsize=(width, height), layout="constrained")


def to_svg(fig: Any, name: str) -> str:
    """``fig`` as an inline ``<svg>`` element whose ids are unique to ``name``."""
    import matplotlib
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": name}):
        fig.savefig(buf, format="svg")
    svg = buf.getvalue()
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg[svg.index("<svg"):], flags=re.S)
    ids = {i for i in re.findall(r'\bid="([^"]+)"', svg) if not i.startswith("fastt-")}

    def unique(m: re.Match[str]) -> str:
        return m.group(1) + (f"{name}-" if m.group(2) in ids else "") + m.group(2)
    return re.sub(r'(\bid="|#)([^"#)\s]+)(?=[")])', unique, svg)


def gantt(predicted: Sequence[Row] | None, measured: Sequence[Row] | None,
          devices: Sequence[str]) -> str:
    """Predicted and measured steps, one row per device, on one time axis (ms)."""
    charts = [(k, r) for k, r in (("predicted", predicted), ("measured", measured)) if r]
    count = max((len(r) for _, r in charts), default=len(devices))
    fig = _figure(11, 1.2 + len(charts) * (0.5 + 0.45 * count))
    axes = fig.subplots(len(charts), 1, sharex=True, squeeze=False)[:, 0] if charts else []
    for ax, (kind, chart) in zip(axes, charts):
        _gantt_rows(ax, kind, chart, devices)
    if len(axes):
        axes[-1].set_xlabel("time in the step (ms)")
    return to_svg(fig, "gantt")


def _gantt_rows(ax: Any, kind: str, chart: Sequence[Row], devices: Sequence[str]) -> None:
    from matplotlib.collections import PolyCollection
    index = {d: k for k, d in enumerate(devices)}
    for k, row in enumerate(chart):
        y = len(chart) - 1 - k  # device 0 on top
        band = ax.axhspan(y - 0.45, y + 0.45, color="#f0f0f0", zorder=0)
        band.set_gid(f"fastt-gantt-{kind}-row-{k}")
        lanes = min(MAX_LANES, 1 + max((lane for *_, lane in row.ops), default=0))
        height = 0.7 / lanes
        boxes = []
        for a, b, lane in row.ops:
            top = y + 0.4 - height * min(lane, lanes - 1)
            boxes.append([(1e3 * a, top - height), (1e3 * b, top - height),
                          (1e3 * b, top), (1e3 * a, top)])
        ops = PolyCollection(boxes, facecolors=color(index.get(row.device, k)),
                             edgecolors="none", alpha=0.85)
        ops.set_gid(f"fastt-gantt-{kind}-ops-{k}")
        ax.add_collection(ops)
        sends = PolyCollection([[(1e3 * a, y - 0.42), (1e3 * b, y - 0.42), (1e3 * b, y - 0.32),
                                 (1e3 * a, y - 0.32)] for a, b, _ in row.transfers],
                               facecolors="#444444", edgecolors="none", alpha=0.6)
        sends.set_gid(f"fastt-gantt-{kind}-transfers-{k}")
        ax.add_collection(sends)
    ax.set_yticks(range(len(chart)))
    ax.set_yticklabels([f"{devnames.short(r.device)}" for r in reversed(chart)])
    ax.set_ylim(-0.6, len(chart) - 0.4)
    ax.autoscale(axis="x")
    ax.set_xlim(left=0)
    ax.set_title(f"{kind} step (ops in colour, lanes where they overlap; transfers into the "
                 "device in grey)", fontsize=9, loc="left")


def busy(devices: Sequence[str], predicted: Sequence[Row] | None,
         measured: Sequence[Row] | None) -> str:
    """Busy time per device, predicted next to measured (ms)."""
    import numpy as np
    fig = _figure(7, 0.8 + 0.45 * len(devices))
    ax = fig.subplots()
    y = np.arange(len(devices))
    for offset, kind, chart, hatch in ((-0.2, "predicted", predicted, ""),
                                       (0.2, "measured", measured, "//")):
        by = {r.device: r.busy_s for r in chart or ()}
        ax.barh(y + offset, [1e3 * by.get(d, 0.0) for d in devices], height=0.38,
                color=[color(k) for k in range(len(devices))], hatch=hatch, alpha=0.85,
                label=kind, edgecolor="white")
    ax.set_yticks(y, [devnames.short(d) for d in devices])
    ax.invert_yaxis()
    ax.set_xlabel("busy time in the step (ms)")
    ax.legend(loc="lower right", fontsize=8)
    return to_svg(fig, "busy")


def comm(pairs: Sequence[dict[str, Any]], fits: dict[tuple[str, str], dict[str, Any]]) -> str:
    """Per device pair, its transfer samples (traced, and the link probe's) and the fitted
    line (first ``MAX_PAIRS``)."""
    import numpy as np
    shown = [p for p in pairs if p.get("samples") or p.get("probed")][:MAX_PAIRS]
    cols = min(3, max(1, len(shown)))
    rows = (len(shown) + cols - 1) // cols
    fig = _figure(3.6 * cols, 0.4 + 2.6 * rows)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, pair in zip(axes, shown):
        data = np.asarray(pair.get("samples", []) + pair.get("probed", []),
                          dtype=float).reshape(-1, 2)
        for key, marker, tint in (("samples", "o", "#1f77b4"), ("probed", "^", "#2ca02c")):
            pts = np.asarray(pair.get(key, []), dtype=float).reshape(-1, 2)
            if len(pts):
                ax.scatter(pts[:, 0] / 1e6, pts[:, 1] * 1e3, s=8, alpha=0.6, color=tint,
                           marker=marker, label="traced" if key == "samples" else "probe")
        fit = fits.get((pair["src"], pair["dst"]))
        if fit is not None:
            x = np.linspace(0.0, max(data[:, 0].max(), 1.0), 50)
            knee = fit.get("knee_bytes") or math.inf
            bend = fit.get("extra_s_per_byte", 0.0) * np.maximum(x - knee, 0.0)
            ax.plot(x / 1e6, 1e3 * (fit["intercept_s"] + fit["slope_s_per_byte"] * x + bend),
                    color="#d62728", lw=1.2, label=f"fit, R²={fit['r2']:.2f}")
            ax.legend(fontsize=7, loc="upper left")
        ax.set_title(f"{devnames.short(pair['src'])} → {devnames.short(pair['dst'])}",
                     fontsize=9)
        ax.set_xlabel("MB", fontsize=8)
        ax.set_ylabel("ms", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[len(shown):]:
        ax.set_visible(False)
    return to_svg(fig, "comm")


def history(entries: Sequence[dict[str, Any]], original: Sequence[float]) -> str:
    """Each strategy's measured step times (dots), its prediction (x) and the original
    graph's median step time (dashed), in ms."""
    import numpy as np
    fig = _figure(max(5.0, 1.4 * len(entries) + 2), 3.4)
    ax = fig.subplots()
    rng = np.random.default_rng(0)
    for x, e in enumerate(entries):
        c = STATUS_COLORS.get(e["status"], "#7f7f7f")
        times = 1e3 * np.asarray(e.get("measured_step_times_s") or [], dtype=float)
        ax.scatter(x + rng.uniform(-0.12, 0.12, len(times)), times, s=14, color=c,
                   label=e["status"].replace("_", " "))
        if e["predicted_step_time_s"] is not None:
            ax.scatter([x], [1e3 * e["predicted_step_time_s"]], marker="x", s=40,
                       color="#333333")
    if original:
        ax.axhline(1e3 * float(np.median(original)), ls="--", color="#555555", lw=1,
                   label="original graph (median)")
    ax.scatter([], [], marker="x", color="#333333", label="predicted")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="best")
    ax.set_xticks(range(len(entries)), [f"{e['n']}: {e['strategy']}" for e in entries],
                  fontsize=8)
    ax.set_ylabel("step time (ms)")
    ax.set_ylim(bottom=0)
    return to_svg(fig, "history")
