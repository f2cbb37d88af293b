"""``FASTT_DUMP_DIR/strategy-<k>/``: what the plugin decided, and what it measured.

``strategy.json`` (schema ``fastt.session-strategy`` version 3, documented in
``fastt/schemas/strategy.schema.json``) holds the strategy document
(``Strategy.to_dict``: devices, placement, order, splits, predicted step time) plus:

- ``source`` (``session``), ``session`` (``<pid>-<k>``), ``n`` (its number in the session),
  ``dump`` (its directory name);
- ``status``: ``measuring``, ``active``, ``superseded``, ``rolled_back``, ``failed``,
  ``unfinished`` (the session closed while it was measured, or before the graph it was found
  faster than was measured again) or ``lost`` (a device it ran on was lost: the strategy
  re-planned over the devices left follows it, ``fastt.plugin.survive``);
- ``reason``: why it was rolled back, failed or left unfinished (empty otherwise);
- ``measured_step_times_s`` / ``measured_step_time_s``: its step times after its warm-up
  (from one training step's start to the next's; median);
- ``original_step_times_s`` / ``original_step_time_s``: the original graph's, likewise;
- ``decision``: how its measurement was judged (``fastt.plugin.measure``): the graph it was
  compared with, the ratio of median step times with its confidence interval, the verdict
  (``faster``, ``slower``, ``undecided``, ``load changed``), the warm-up steps left out,
  whether the steps settled, the other processes' load (cores); null before it is measured;
- ``speedup``: original median / this strategy's median (``null`` before it is measured);
- ``activated_at_step``, ``order_mechanism`` (``priority-executor``,
  ``control-dependencies`` or ``none``); ``ordered`` is false where its steps ran in
  TensorFlow's own order (its plan predicted faster so, or a trial of a kept plan in that
  order);
- ``history``: every strategy of this session so far, with its status, step times and dump;
- ``overhead``: what fastt's own work had cost the run when it was written, and its budget
  (``fastt.plugin.budget``).

Next to it: ``cost_models.json`` (the cost models it was planned with), ``predicted_trace.json``
(its plan replayed under them), ``measured_trace.json`` (one traced step on it), ``graph.dot``
and ``report.html`` (``fastt.inspect``).
"""
from __future__ import annotations

from typing import Any, Sequence

from fastt.costs import CostModels
from fastt.costs.source import ModelCosts
from fastt.inspect import trace, writer
from fastt.ir import Graph
from fastt.plugin.entry import Entry
from fastt.sched.sim.problem import Device


def document(entry: Entry, history: list[Entry], original_s: list[float],
             order_mechanism: str, session: str) -> dict[str, Any]:
    """``entry``'s ``strategy.json`` document; ``order_mechanism``: how this session enforces
    a planned order. Its ``ordered`` is the entry's (its strategy's, false for a trial of it
    in TensorFlow's own order), and no order is enforced where it is false."""
    doc = writer.document(
        entry.strategy, source="session", session=session, n=entry.n, status=entry.status,
        reason=entry.reason, measured_s=entry.measured_s, original_s=original_s,
        activated_at_step=entry.step,
        order_mechanism=order_mechanism if entry.ordered else "none",
        predicted_s=entry.predicted_s, decision=entry.decision(),
        history=[writer.history_entry(e.n, e.name, e.status, e.predicted_s, e.reason, e.dump,
                                     e.measured_s, e.step,
                                     e.verdict.verdict if e.verdict else None)
                 for e in history])
    doc["ordered"] = entry.ordered
    return doc


def write(root: str, entry: Entry, doc: dict[str, Any], models: CostModels | None,
          devices: Sequence[Device], original: Graph, strict: bool = False) -> str:
    """Write the entry's directory (refresh it when ``entry.dump`` names one); its path.
    ``original``: the user's training step the strategy was planned for."""
    path = entry.dump or writer.new_dir(root)
    s, meta = entry.strategy, entry.timeline

    def predicted() -> dict[str, Any]:
        assert models is not None  # passed only with them
        return trace.predicted(s, devices, ModelCosts(models), original)

    def measured() -> dict[str, Any]:
        return trace.measured(meta, s.devices, s.name)
    writer.write(path, doc, strategy=s, models=models,
                predicted=predicted if models is not None else None,
                measured=measured if meta is not None else None, strict=strict)
    return path


def refresh(paths: Sequence[str], strict: bool = False) -> None:
    """Rewrite the reports of ``paths`` (a session's dumps: each shows its whole history)."""
    for p in dict.fromkeys(p for p in paths if p):
        writer.refresh(p, strict)
