"""``FASTT_DUMP_DIR/strategy-<n>/``: what the plugin decided, and what it measured.

``strategy.json`` (schema ``fastt.session-strategy`` version 1) holds the strategy document
(``Strategy.to_dict``: devices, placement, order, splits, predicted step time) plus:

- ``status``: ``measuring``, ``active``, ``superseded``, ``rolled_back`` or ``failed``;
- ``reason``: why it was rolled back or failed (empty otherwise);
- ``measured_step_times_s`` / ``measured_step_time_s``: its steps after activation (median);
- ``original_step_times_s`` / ``original_step_time_s``: the original graph's steps;
- ``speedup``: original median / this strategy's median (``null`` before it is measured);
- ``activated_at_step``, ``order_mechanism`` (``priority-executor``, ``control-dependencies`` or ``none``);
- ``history``: every strategy of this session so far, as (n, strategy, status).

``cost_models.json`` next to it holds the cost models it was planned with.
"""
from __future__ import annotations

import itertools
import json
import os
import statistics
from typing import Any

from fastt.costs import CostModels
from fastt.plugin.controller import Entry

SCHEMA = "fastt.session-strategy"
SCHEMA_VERSION = 1
_numbers = itertools.count(1)  # strategy-<n> is unique in a process, across sessions


def document(entry: Entry, history: list[Entry], original_s: list[float],
             order_mechanism: str) -> dict[str, Any]:
    doc = entry.strategy.to_dict()
    orig = statistics.median(original_s) if original_s else None
    mine = entry.measured_median_s
    doc.update({
        "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "n": entry.n,
        "status": entry.status, "reason": entry.reason,
        "predicted_step_time_s": entry.predicted_s,
        "measured_step_times_s": entry.measured_s, "measured_step_time_s": mine,
        "original_step_times_s": original_s, "original_step_time_s": orig,
        "speedup": (orig / mine) if orig and mine else None,
        "activated_at_step": entry.step, "order_mechanism": order_mechanism,
        "history": [{"n": e.n, "strategy": e.name, "status": e.status} for e in history],
    })
    return doc


def write(root: str, entry: Entry, doc: dict[str, Any], models: CostModels | None) -> str:
    """Write the entry's directory (refresh it when ``entry.dump`` names one); its path."""
    path = entry.dump or os.path.join(root, f"strategy-{next(_numbers)}")
    os.makedirs(path, exist_ok=True)
    _write_json(os.path.join(path, "strategy.json"), doc)
    if models is not None and not os.path.exists(os.path.join(path, "cost_models.json")):
        models.save(os.path.join(path, "cost_models.json"))
    return path


def _write_json(path: str, doc: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)
