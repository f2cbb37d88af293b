"""Consistent snapshots of the training state, and the runs since, so that a lost device
costs the steps since the last snapshot, not the run.

A snapshot is the state a graph's session holds at a step boundary (variables, optimizer
slots, the global step, iterator positions, random-stream counters: ``fastt.plugin.state``),
copied into this process. Between snapshots every run fastt served on that graph is kept
with copies of its feeds (``Replay``); restored into a new session, the snapshot and the
runs replayed in order bring it to the state the lost one held before the failed run, value
for value: fastt's graphs draw their random numbers from counters carried in the state
(``fastt.plugin.streams``), and iterators resume from their serialized positions.

When to take one (``Snapshots.due``): a copy costs ``capture_s``; taken every ``interval``
steps it costs ``capture_s / interval`` per step, which is kept at most ``SHARE`` of the step
time, so ``interval = ceil(capture_s / (SHARE * step_s))``, re-derived at each snapshot. The
feeds kept meanwhile are bounded too (``replay_bytes``): past the bound, the next step
boundary takes a snapshot whatever the interval.
"""
from __future__ import annotations

import logging
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from fastt.plugin.state import State
from fastt.plugin.streams import COUNTER
from tf_patches import session_hook as hook

log = logging.getLogger("fastt")
SHARE = 0.02  # of the step time, what snapshots may cost on average
STEP_TIMES = 9  # the last step times whose median is the step time snapshots are held to


@dataclass
class Replay:
    """One run fastt served since the snapshot: what it fetched and ran, and what it was fed
    (copies: a script may refill its arrays in place)."""
    fetches: list[str]
    targets: list[str]
    feeds: dict[str, Any]

    @property
    def nbytes(self) -> int:
        return sum(int(getattr(v, "nbytes", 0)) for v in self.feeds.values())


def kept_feeds(feeds: dict[str, Any]) -> dict[str, Any]:
    """Copies of a run's feed values that later changes to the script's arrays leave as
    they were."""
    return {k: np.array(v, copy=True) if isinstance(v, np.ndarray) else v
            for k, v in feeds.items()}


@dataclass
class Snapshot:
    state: State
    step: int  # the training steps run when it was taken
    runs: list[Replay] = field(default_factory=list)
    nbytes: int = 0  # of the runs' feeds

    def state_bytes(self) -> int:
        return sum(int(np.asarray(v).nbytes) for v in self.state.values.values()) + \
            sum(len(b) for b in self.state.iterators.values())


class Snapshots:
    """The last snapshot of the graph that runs, the runs since, and when to take the next
    (``clock``: seconds, for the capture and step times)."""

    def __init__(self, replay_bytes: float, clock: Callable[[], float] = time.perf_counter
                 ) -> None:
        self.replay_bytes, self._clock = replay_bytes, clock
        self.last: Snapshot | None = None
        self.interval = 1  # steps between snapshots
        self.capture_s: float | None = None  # what the last copy took
        self.taken = 0
        self._steps: list[float] = []
        self._step_began: float | None = None
        self.step = 0  # training steps ended

    def restart(self, state: State) -> None:
        """A graph starts from ``state`` (an activation, a rollback, a recovery): the
        snapshot is that state, with no runs since."""
        self.last = Snapshot(state, self.step)

    def ran(self, fetches: list[str], targets: list[str], feeds: dict[str, Any]) -> None:
        """A run succeeded on the graph the snapshot is of (none before the first)."""
        if self.last is None:
            return
        r = Replay(list(fetches), list(targets), kept_feeds(feeds))
        self.last.runs.append(r)
        self.last.nbytes += r.nbytes

    def step_ended(self) -> None:
        """A training step ended (its time, from the last one's end, is a step time)."""
        now = self._clock()
        if self._step_began is not None:
            self._steps = (self._steps + [now - self._step_began])[-STEP_TIMES:]
        self._step_began = now
        self.step += 1

    def due(self) -> bool:
        """Whether a snapshot is taken at this step boundary."""
        last = self.last
        if last is None:  # the first step boundary of a graph whose start fastt did not hold
            return True
        return self.step - last.step >= self.interval or last.nbytes > self.replay_bytes

    def take(self, capture: Callable[[], State]) -> Snapshot:
        """A snapshot from ``capture`` (the running graph's state now), and the interval to
        the next, from what the copy took."""
        began = self._clock()
        state = capture()
        took = self._clock() - began
        # the copy's own time is not a step time
        self._step_began = None if self._step_began is None else self._step_began + took
        self.last = Snapshot(state, self.step)
        self.capture_s, self.taken = took, self.taken + 1
        step_s = statistics.median(self._steps) if self._steps else None
        self.interval = max(1, math.ceil(took / (SHARE * step_s) - 1e-9)) if step_s else 1
        log.debug("fastt: snapshot at step %d (%.1f MiB) in %.1f ms; the next in %d steps",
                  self.step, last_mib(self.last), 1e3 * took, self.interval)
        return self.last


def last_mib(snap: Snapshot) -> float:
    return snap.state_bytes() / 2 ** 20


def write_checkpoint(state: State, directory: str) -> str:
    """``state``'s variables as a TensorFlow checkpoint in ``directory`` that the script's
    own ``tf.compat.v1.train.Saver`` restores (its keys are the variables' op names, as a
    ``Saver`` of the variables saves them); its path prefix. Iterator positions are not in
    it."""
    os.makedirs(directory, exist_ok=True)
    prefix = os.path.join(directory, "fastt-snapshot")
    g = tf.Graph()
    with g.as_default():
        variables = {}
        for name, value in sorted(state.values.items()):
            if name.startswith(COUNTER + "/"):
                continue  # fastt's own
            v = tf.compat.v1.Variable(np.asarray(value), name="v", trainable=False,
                                      use_resource=True)
            variables[name] = v
        saver = tf.compat.v1.train.Saver(variables, write_version=2)
        with hook.plain_sessions(), tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return saver.save(sess, prefix, write_meta_graph=False)
