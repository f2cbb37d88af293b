"""Which of a session's runs is the training step, and what to say when none is (no
TensorFlow here).

The training step is the run signature (fetches, targets, feeds) that writes trainable
variables and recurs. ``StepFinder.see`` counts every run by signature and asks ``analyse``
once per signature whether it writes trainable variables; ``why_not_found`` and
``signatures`` describe the runs when no step was found, for the line the plugin logs and the
record it writes.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable

#: A session that ran this many times without a training step is said to have none (it is
#: still watched: a step that recurs later is planned).
DECLINE_AFTER_RUNS = 100
Signature = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]


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


def _names(signature: Signature, limit: int = 3) -> str:
    names = list(signature[0]) + list(signature[1])
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "") \
        if names else "nothing"
