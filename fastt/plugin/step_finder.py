"""Which of a session's runs is the training step, and what to say when none is (no
TensorFlow here).

The training step is the run signature (fetches, targets, feeds) that writes trainable
variables and recurs, or that writes them and would not fit its device's memory as it is (it
cannot run once to recur). ``StepFinder.see`` counts every run by signature and asks ``analyse``
once per signature whether it writes trainable variables; ``why_not_found`` and
``signatures`` describe the runs when no step was found, for the line the plugin logs and the
record it writes. ``StepDetector`` turns that into the session's ``Controller``, or a decline
said once.
"""
from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Callable

from fastt.inspect import writer
from fastt.ir import Graph, writes_variable
from fastt.op_types import PLAIN_ASSIGNS
from fastt.plugin.controller import Controller
from fastt.plugin.settings import Settings

log = logging.getLogger("fastt")

#: A session that ran this many times without a training step is said to have none (it is
#: still watched: a step that recurs later is planned).
DECLINE_AFTER_RUNS = 100
Signature = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]


def updates_trainables(graph: Graph, names: list[str], trainable: set[str]) -> bool:
    """Whether running ``names`` updates a trainable variable (any variable when
    ``trainable`` is empty): what makes a run a training step. An update reads what it
    changes (an optimizer's apply, an add, a scatter, or an assign of a value computed from
    variables); an initializer or a restore assigns a value from elsewhere and is not one."""
    step = graph.fan_in(names)
    for op in step:
        if not (writes_variable(op) and op.inputs) or \
                (trainable and op.inputs[0].op not in trainable):
            continue
        if op.type not in PLAIN_ASSIGNS or len(op.inputs) < 2:
            return True
        if any(o.is_variable for o in step.fan_in([op.inputs[1].op])):
            return True
    return False


class StepFinder:
    def __init__(self, analyse: Callable[[list[str]], bool]) -> None:
        self.analyse = analyse  # fetch and target names -> whether they write trainables
        self.kinds: dict[Signature, bool] = {}
        self.runs: Counter[Signature] = Counter()
        self.total = 0

    def see(self, signature: Signature, names: list[str]) -> bool:
        """Count a run; whether it is the training step (it writes trainable variables and
        ran before)."""
        self.total += 1
        self.runs[signature] += 1
        kind = self.kinds.get(signature)
        if kind is None:
            kind = self.kinds[signature] = self.analyse(names)
        return kind and self.runs[signature] >= 2

    def first_update(self, signature: Signature) -> bool:
        """Whether the run just seen is the first of a signature that writes trainable
        variables."""
        return bool(self.kinds.get(signature)) and self.runs[signature] == 1

    def why_not_found(self) -> str:
        """Why no run was taken for the training step, from what the runs looked like."""
        kinds = len(self.runs)
        seen = f"{self.total} run{'s' * (self.total != 1)} of {kinds} kind{'s' * (kinds != 1)}"
        once = [s for s, k in self.kinds.items() if k and self.runs[s] < 2]
        if once:
            return (f"no training step recognised ({seen}): the run that updates trainable "
                    f"variables ({_names(once[0])}) ran only once")
        if not self.runs:
            return "no training step recognised: the session ran nothing"
        top, n = self.runs.most_common(1)[0]
        return (f"no training step recognised ({seen}): none updates a trainable variable; "
                f"the most frequent ({n}x) runs {_names(top)}")

    def signatures(self) -> list[dict[str, Any]]:
        """The runs by signature, most frequent first (for the declined-session record)."""
        return [{"fetches": list(s[0]), "targets": list(s[1]), "feeds": list(s[2]),
                 "runs": n, "updates_trainables": self.kinds.get(s)}
                for s, n in self.runs.most_common()]


class StepDetector:
    """A session's runs, until one is its training step: then ``start(names)`` gives its
    controller (None: it declined, through ``decline``). When fastt does not plan the session,
    it says why once and records it in the dump directory."""

    def __init__(self, settings: Settings, session: str, analyse: Callable[[list[str]], bool],
                 start: Callable[[list[str]], Controller | None],
                 urgent: Callable[[list[str]], bool] = lambda _: False) -> None:
        self.settings, self.session, self.start = settings, session, start
        # whether a run that writes trainables cannot run as it is even once (it would not
        # fit its device's memory): the step then, found at its first run
        self.urgent = urgent
        self.finder = StepFinder(analyse)
        self.controller: Controller | None = None
        self.off = False  # declined for good
        self._declined = ""  # the reason recorded
        self._signature: Signature | None = None

    def controller_for(self, signature: Signature, names: list[str]) -> Controller | None:
        """The controller when this run is the training step, else None."""
        try:
            return self._find(signature, names)
        except Exception as e:  # noqa: BLE001 - never break training
            if self.settings.strict:
                raise
            self.decline(f"could not analyse the graph ({type(e).__name__}: {e})",
                         logging.WARNING)
            return None

    def _find(self, signature: Signature, names: list[str]) -> Controller | None:
        if self.controller is not None:
            if signature != self._signature and self.finder.see(signature, names) \
                    and self.finder.runs[signature] == 2:
                log.info("fastt: another training step recurs (%s); fastt plans the first one "
                         "found, this one runs unplanned on the same graph",
                         ", ".join(sorted(signature[1] + signature[0])[:3]))
            return self.controller if signature == self._signature else None
        if self.off:
            return None
        if self.finder.see(signature, names) or \
                (self.finder.first_update(signature) and self.urgent(names)):
            self.controller = self.start(names)
            if self.controller is not None:
                self._signature = signature
                if self._declined:  # said too early: a training step did recur
                    writer.remove_declined(self.settings.dump_dir, self.session)
                    self._declined = ""
            return self.controller
        if self.finder.total == DECLINE_AFTER_RUNS:
            self.decline(self.finder.why_not_found(), off=False)
        return None

    def decline(self, reason: str, level: int = logging.INFO, off: bool = True) -> None:
        """fastt does not plan this session: say why, once, and record it in the dump
        directory (``off=False``: not yet; a training step found later is still planned)."""
        self.off = self.off or off
        if self._declined:
            return
        log.log(level, "fastt: %s; this session runs as it is%s", reason,
                "" if off else " until a training step recurs")
        self._declined = reason
        if self.settings.dump_dir:
            writer.write_declined(self.settings.dump_dir, writer.declined_document(
                self.session, reason, self.finder.total, self.finder.signatures()),
                self.settings.strict)

    def close(self) -> None:
        """The session closes: if it ran without a training step found, say so."""
        if self.controller is None and not self.off and self.finder.total:
            self.decline(self.finder.why_not_found())


def _names(signature: Signature, limit: int = 3) -> str:
    names = list(signature[0]) + list(signature[1])
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "") \
        if names else "nothing"
