"""``FASTT_VERIFY`` in a session: a strategy's first step run again on the original graph, from
the state it started with and on the same feeds, and compared (``fastt.plugin.verify``); each
check appended to ``FASTT_VERIFY_REPORT`` when it is set."""
from __future__ import annotations

import logging
from typing import Any, Callable

import tensorflow as tf

from fastt.errors import FasttError
from fastt.op_types import PYTHON
from fastt.plugin import messages as say
from fastt.plugin import verify
from fastt.plugin.activation import Running
from fastt.plugin.controller import Controller
from fastt.plugin.state import has_op
from fastt.plugin.streams import StreamCounter
from fastt.plugin.verify import Difference
from tf_patches import session_hook as hook

log = logging.getLogger("fastt")


class VerifyError(FasttError):
    """A strategy's first step differs from the original graph's beyond reassociation."""


class StepCheck:
    """The checks of one user session's first steps: ``graph`` is the user's graph, whose
    runs ``streams`` finds; ``report`` the file each check is appended to ("": none)."""

    def __init__(self, graph: tf.Graph, streams: StreamCounter, report: str) -> None:
        self.graph, self.streams, self.report = graph, streams, report

    def check(self, cur: Running, original: Callable[[], Running], ctl: Controller | None,
              fetches: list[str], targets: list[str], feeds: dict[str, Any],
              values: list[Any]) -> None:
        """The step ``cur`` ran first (``fetches`` gave ``values``), run again on the original
        graph (``original()``: an inner session on it from the state ``cur`` started with) on
        the same ``feeds`` (by name); a ``VerifyError`` naming the worst difference beyond
        reassociation."""
        assert cur.snapshot is not None
        ran = self.streams.fan_in(fetches, targets, list(feeds))
        python = sorted(n for n in ran if has_op(self.graph, n)
                        and self.graph.get_operation_by_name(n).type in PYTHON)
        if python:  # a second run would call the script's Python again (draw another batch)
            why = f"it runs the script's Python ({python[0]}), which a second run would call again"
            log.info("fastt: the first step of %s not verified: %s", cur.strategy.name, why)
            self.record(cur, ctl, [], why)
            return
        ref = original()
        try:
            names = fetches + targets
            out = hook.run_elements(
                ref.sess, [ref.element(n) for n in fetches], [ref.element(n) for n in targets],
                {ref.element(n): v for n, v in feeds.items()}, None, None)
            found = verify.differences(dict(zip(fetches, out)), dict(zip(fetches, values)),
                                       "fetch")
            found += verify.differences(ref.capture().values, cur.capture().values, "variable",
                                        before=cur.snapshot.values)
        finally:
            ref.close()
        worst = verify.verdict(found)
        self.record(cur, ctl, found)
        log.info("fastt: verified the first step of %s against the original graph: %s",
                 cur.strategy.name, worst or f"{len(found)} tensors within reassociation "
                 f"(largest {max((d.relative for d in found), default=0.0):.2g})")
        if worst:
            raise VerifyError(worst + f" ({len(names)} fetches and targets)")

    def record(self, cur: Running, ctl: Controller | None, found: list[Difference],
               skipped: str = "") -> None:
        """The check appended to the report (a file that cannot be written is said once;
        training goes on)."""
        if not self.report:
            return
        entry = ctl.running if ctl is not None else None
        name = say.label(entry) if entry is not None and entry.name == cur.strategy.name \
            else cur.strategy.name
        try:
            verify.record(self.report, name, found, skipped,
                          step=ctl.step if ctl is not None else None)
        except OSError as e:
            log.warning("fastt: FASTT_VERIFY_REPORT=%s cannot be written (%s); checks are "
                        "logged only", self.report, e)
            self.report = ""
