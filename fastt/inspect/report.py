"""``report.html``: one strategy dump as a self-contained page (no network, charts inline).

Sections: the summary; the Gantt chart of the predicted and the measured step, one row per
device; op count and busy time per device; the split table; the communication model per device
pair with its samples; the session's history of strategies with their step times. Charts come
from ``fastt.inspect.figures`` (matplotlib); without matplotlib the page has the tables only.
"""
from __future__ import annotations

import contextlib
import html
import os
from typing import Any, Sequence

from fastt import devices as devnames
from fastt.inspect import figures
from fastt.inspect.dumps import Dump, load, session_history, siblings
from fastt.inspect.trace import Row, rows

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;
color:#222;max-width:1200px}
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin-top:32px;border-bottom:1px solid
#ddd;padding-bottom:4px}table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}th{background:#f5f5f5;
cursor:pointer}td.num{text-align:right;font-variant-numeric:tabular-nums}
.status{display:inline-block;padding:1px 8px;border-radius:9px;color:#fff;font-size:13px}
.note{color:#666;font-size:13px}figure{margin:8px 0}svg{max-width:100%;height:auto}
code{background:#f5f5f5;padding:0 3px}
"""
# Click a column header to sort its table; marks the page as ready (the script ran).
_SCRIPT = """
document.querySelectorAll("table.sortable th").forEach(function (th, col) {
  th.addEventListener("click", function () {
    var body = th.closest("table").tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var asc = th.dataset.order !== "asc";
    th.dataset.order = asc ? "asc" : "desc";
    rows.sort(function (a, b) {
      var x = a.cells[th.cellIndex].dataset.v || a.cells[th.cellIndex].textContent;
      var y = b.cells[th.cellIndex].dataset.v || b.cells[th.cellIndex].textContent;
      var nx = parseFloat(x), ny = parseFloat(y);
      var c = (isNaN(nx) || isNaN(ny)) ? x.localeCompare(y) : nx - ny;
      return asc ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
document.body.dataset.ready = "1";
"""


def write(path: str) -> str:
    """Write ``path/report.html`` for the dump in ``path``; its path."""
    page = render(load(path))
    out = os.path.join(path, "report.html")
    tmp = out + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(page)
        os.replace(tmp, out)
    except BaseException:  # no half page left behind
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    return out


def render(dump: Dump) -> str:
    """The report page of ``dump``."""
    doc = dump.doc
    charts = figures.available()
    predicted = _rows(dump.load("predicted_trace.json"))
    measured = _rows(dump.load("measured_trace.json"))
    models = dump.load("cost_models.json")
    history = session_history(siblings(dump))
    parts = [_header(doc), _summary(doc, dump),
             _gantt(doc, predicted, measured, charts),
             _devices(doc, predicted, measured, charts), _splits(doc),
             _comm(models, charts), _history(doc, history, charts)]
    title = f"fastt {dump.name}: {doc['strategy']}"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
            + "".join(parts) + f"<script>{_SCRIPT}</script></body></html>\n")


def _rows(trace: dict[str, Any] | None) -> list[Row] | None:
    return rows(trace) if trace else None


class _Html(str):
    """Markup that goes into the page as it is."""


def _e(v: Any) -> str:
    return v if isinstance(v, _Html) else html.escape(str(v), quote=True)


def _ms(s: float | None) -> str:
    return "n/a" if s is None else f"{1e3 * s:.3f} ms"


def _table(headers: Sequence[str], body: Sequence[Sequence[Any]], numeric: Sequence[int] = ()
           ) -> str:
    """A sortable table; columns in ``numeric`` are right-aligned."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    lines = []
    for r in body:
        cells = "".join(f"<td class=\"num\">{_e(c)}</td>" if k in numeric else f"<td>{_e(c)}</td>"
                        for k, c in enumerate(r))
        lines.append(f"<tr>{cells}</tr>")
    return (f"<table class=\"sortable\"><thead><tr>{head}</tr></thead><tbody>"
            + "".join(lines) + "</tbody></table>")


def _figure(fig_id: str, make: Any, *args: Any) -> str:
    return f"<figure id=\"{fig_id}\">{make(*args)}</figure>"


def _no_charts() -> str:
    return "<p class=\"note\">Charts need matplotlib (<code>pip install matplotlib</code>).</p>"


def _header(doc: dict[str, Any]) -> str:
    color = figures.STATUS_COLORS.get(doc["status"], "#7f7f7f")
    reason = f"<p>{_e(doc['reason'])}</p>" if doc["reason"] else ""
    return (f"<h1>Strategy {doc['n']}: {_e(doc['strategy'])} on {len(doc['devices'])} devices "
            f"<span class=\"status\" style=\"background:{color}\">"
            f"{_e(doc['status'].replace('_', ' '))}</span></h1>{reason}")


def _summary(doc: dict[str, Any], dump: Dump) -> str:
    speedup = doc["speedup"]
    items = [
        ("source", "session plugin (FASTT=1)" if doc["source"] == "session"
         else "fastt plan / compare"),
        ("session", doc["session"]), ("dump", dump.path),
        ("devices", ", ".join(doc["devices"])),
        ("micro-batches" if doc["strategy"] == "pipedream" else "replicas", doc["replicas"]),
        *([("placer's note", doc["note"])] if doc.get("note") else []),
        *([("weight transfers by need", _transfers(doc["transfer_priorities"]))]
          if doc.get("transfer_priorities") else []),
        ("predicted step", _ms(doc["predicted_step_time_s"])),
        ("with link contention", _ms(doc["simulated_step_time_s"])),
        ("measured step (median)", _ms(doc["measured_step_time_s"])),
        ("original graph (median)", _ms(doc["original_step_time_s"])),
        ("speedup over the original", "n/a" if speedup is None else f"{speedup:.2f}x"),
        ("plan time", f"{doc['plan_time_s']:.2f} s ({doc['dpos_runs']} DPOS runs)"),
        ("activated at step", doc["activated_at_step"] if doc["activated_at_step"] is not None
         else "n/a"),
        ("op order enforced by", doc["order_mechanism"] or "n/a"),
        ("ops planned", len(doc["placement"])), ("splits", len(doc["splits"])),
        *([("weights kept whole", ", ".join(doc["kept_whole"]))]
          if doc.get("kept_whole") else []),
    ]
    rows_ = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in items)
    links = [f"<a href=\"{f}\">{f}</a>" for f in ("strategy.json", "predicted_trace.json",
                                                  "measured_trace.json", "cost_models.json",
                                                  "graph.svg", "graph.dot")
             if dump.file(f)]
    return (f"<table>{rows_}</table><p class=\"note\">Files: {' · '.join(links)}. The traces "
            "open in Perfetto or chrome://tracing.</p>")


def _transfers(t: dict[str, Any]) -> str:
    return (f"{t['transfers']} over {t['links']} links, "
            f"{'kept' if t['kept'] else 'not kept'} (simulated "
            f"{_ms(t['simulated_step_time_s'])} ordered, {_ms(t['simulated_without_s'])} not)")


def _gantt(doc: dict[str, Any], predicted: list[Row] | None, measured: list[Row] | None,
           charts: bool) -> str:
    out = ["<h2>Schedule: predicted and measured step</h2>"]
    if measured is None:
        out.append("<p class=\"note\">No measured step: this strategy was "
                   f"{'only planned' if doc['source'] == 'plan' else 'not traced'}.</p>")
    if predicted is None and measured is None:
        return "".join(out)
    out.append(_figure("fastt-gantt", figures.gantt, predicted, measured, doc["devices"])
               if charts else _no_charts())
    return "".join(out)


def _devices(doc: dict[str, Any], predicted: list[Row] | None, measured: list[Row] | None,
             charts: bool) -> str:
    placed = {d: 0 for d in doc["devices"]}
    for d in doc["placement"].values():
        placed[d] = placed.get(d, 0) + 1
    pred = {r.device: r for r in predicted or ()}
    meas = {r.device: r for r in measured or ()}
    body = []
    for d in list(placed) + [d for d in meas if d not in placed]:
        p, m = pred.get(d), meas.get(d)
        body.append([devnames.short(d), placed.get(d, 0),
                     _ms(p.busy_s) if p else "n/a", len(m.ops) if m else "n/a",
                     _ms(m.busy_s) if m else "n/a", len(m.transfers) if m else "n/a"])
    out = ["<h2>Devices</h2>",
           _table(["device", "ops placed", "predicted busy", "kernels measured",
                   "measured busy", "transfers measured"], body, numeric=(1, 2, 3, 4, 5))]
    if charts and (predicted or measured):
        out.append(_figure("fastt-busy", figures.busy, list(placed), predicted, measured))
    return "".join(out)


def _splits(doc: dict[str, Any]) -> str:
    if not doc["split_details"]:
        return "<h2>Splits</h2><p class=\"note\">No op was split.</p>"
    body = [[s["op"], s["dim"], s["n"], _ms(s["time_before_s"]),
             "n/a" if s["param_bytes"] is None else s["param_bytes"],
             _ms(s["step_before_s"]), _ms(s["step_after_s"])] for s in doc["split_details"]]
    return ("<h2>Splits</h2>" + _table(
        ["op", "dimension", "parts", "time before split", "parameter bytes",
         "predicted step before", "predicted step after"], body, numeric=(2, 3, 4, 5, 6)))


def _comm(models: dict[str, Any] | None, charts: bool) -> str:
    out = ["<h2>Communication model</h2>"]
    if models is None:
        out.append("<p class=\"note\">No cost models in this dump (planned with analytical "
                   "costs).</p>")
        return "".join(out)
    comm = models.get("comm", {})
    fits = {(f["src"], f["dst"]): f for f in comm.get("fits", [])}
    pairs = comm.get("pairs", [])
    body = []
    for p in pairs:
        f = fits.get((p["src"], p["dst"]))
        body.append([devnames.short(p["src"]), devnames.short(p["dst"]),
                     len(p["samples"]) + len(p.get("probed", [])),
                     "n/a" if f is None else f"{f['intercept_s'] * 1e6:.1f}",
                     "n/a" if f is None or f["slope_s_per_byte"] <= 0
                     else f"{1e-9 / f['slope_s_per_byte']:.3f}",
                     "n/a" if f is None else f"{f['r2']:.3f}",
                     "none" if f is None or not f.get("knee_bytes") else
                     f"{f['knee_bytes'] / 2 ** 20:.0f} MiB, +{f['extra_s_per_byte'] * 1e9:.2f}"])
    if not pairs:
        out.append("<p class=\"note\">No transfer between devices was measured.</p>")
        return "".join(out)
    out.append("<p class=\"note\">Transfer time = intercept + bytes / bandwidth: one linear "
               "regression per device pair, fitted on the samples below (traced transfers: "
               "their lower decile; the link probe's alone: their median line), and past a "
               "knee, where the probe's large sizes cost more per byte, that much more per byte "
               "(ns).</p>")
    out.append(_table(["from", "to", "samples", "intercept (µs)", "bandwidth (GB/s)", "R²",
                       "knee, extra ns/byte"], body, numeric=(2, 3, 4, 5)))
    if charts:
        out.append(_figure("fastt-comm", figures.comm, pairs, fits))
        if len(pairs) > figures.MAX_PAIRS:
            out.append(f"<p class=\"note\">Charts of the first {figures.MAX_PAIRS} pairs of "
                       f"{len(pairs)}.</p>")
    return "".join(out)


def _history(doc: dict[str, Any], history: list[dict[str, Any]], charts: bool) -> str:
    out = ["<h2>History of the session's strategies</h2>"]
    if doc["original_step_time_s"] is not None:
        out.append(f"<p>Original graph: {_ms(doc['original_step_time_s'])} per step "
                   f"(median of {len(doc['original_step_times_s'])} warm-up steps).</p>")
    body = []
    for h in history:
        dump = _Html(f"<a href=\"../{_e(h['dump'])}/report.html\">{_e(h['dump'])}</a>") \
            if h["dump"] and h["n"] != doc["n"] else h["dump"]
        orig, mine = doc["original_step_time_s"], h["measured_step_time_s"]
        body.append([h["n"], h["strategy"], h["status"].replace("_", " "),
                     _ms(h["predicted_step_time_s"]), _ms(mine),
                     f"{orig / mine:.2f}x" if orig and mine else "n/a",
                     "n/a" if h["activated_at_step"] is None else h["activated_at_step"],
                     h["reason"], dump])
    out.append(_table(["n", "strategy", "status", "predicted step", "measured step (median)",
                       "speedup", "activated at step", "why", "dump"], body,
                      numeric=(0, 3, 4, 5, 6)))
    if charts and history:
        out.append(_figure("fastt-history", figures.history, history,
                           doc["original_step_times_s"]))
    return "".join(out)
