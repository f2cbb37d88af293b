"""Training through a lost device or server (``FASTT_ELASTIC``): what is lost (``Loss``), and
the recovery (``recover``): the training step re-planned over what is left with the cost models
fastt has (no new warm-up or profile), in a new session (on a surviving server's master when
the master was lost) holding the last snapshot, the runs since replayed
(``fastt.plugin.elastic``). The failed run then runs again there, and the script's loop never
sees the failure."""
from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from fastt.cluster.health import Watch
from fastt.cluster.spec import Task
from fastt.errors import WorkerLostError
from fastt.plugin import elastic
from fastt.plugin import messages as say
from fastt.sched import registry

if TYPE_CHECKING:
    from fastt.plugin.backend import PluginBackend

log = logging.getLogger("fastt")


@dataclass
class Loss:
    """What is lost: devices fastt planned over, servers of the cluster (and whether the
    sessions' master is one of them)."""
    devices: list[str]
    tasks: list[Task]
    master: bool = False

    def __bool__(self) -> bool:
        return bool(self.devices or self.tasks)

    def named(self) -> str:
        return ", ".join(str(t) for t in self.tasks) if self.tasks else ", ".join(self.devices)


def find_loss(watch: Watch | None, devices: Sequence[str]) -> Loss:
    """Of ``devices``, those of a server of ``watch``'s cluster that does not answer now
    (none of this process's devices can be lost: no cluster, no loss)."""
    if watch is None:
        return Loss([], [])
    tasks = watch.lost_tasks()
    lost = [d for d in devices if any(d.startswith(t.device_prefix + "/") for t in tasks)]
    return Loss(lost, tasks, watch.master in tasks)


def recover(backend: "PluginBackend", loss: Loss, error: BaseException | None) -> None:
    """The running graph lost ``loss`` (its run failed with ``error``; None: found lost
    between runs): the training step on the devices left from the last snapshot, the runs
    since replayed; it serves the runs from now on. ``WorkerLostError``, naming what is left
    and a checkpoint of the snapshot, where nothing can run it."""
    p, e = backend.plugin, backend.engine
    snaps, cur, ctl = p.snapshots, p.current, p.controller
    assert snaps is not None and snaps.last is not None and ctl is not None
    snap, began = snaps.last, time.perf_counter()
    left = [d for d in e.devices if d.name not in loss.devices]
    why = f"{type(error).__name__}" if error is not None else "found between steps"
    if not left or (loss.master and p.inputs.staged):
        path = elastic.write_checkpoint(snap.state, tempfile.mkdtemp(prefix="fastt-"))
        what = "every device fastt planned over is lost" if not left else \
            "the script's input pipeline ran in its own session on the lost master"
        raise WorkerLostError(
            f"{loss.named()} lost ({why}): {what}"
            f"{'' if not left else ' (left: ' + ', '.join(d.name for d in left) + ')'}; "
            f"the training state of step {snap.step} is in the TensorFlow checkpoint {path}, "
            "which the script's Saver restores") from error
    if p.watch is not None and loss.tasks:
        p.watch.forget(loss.tasks)
        p.lose_servers(loss)
    backend.forget_devices(loss.devices)
    running = cur.strategy
    if running is None or len(left) < 2 or running.name not in registry.names():
        strategy = e.original_plan()  # the step on the first device left
    else:
        strategy = backend.plan(running.name)
    new = backend.build(strategy, state=snap.state)
    try:
        for r in snap.runs:
            new.serve(r.fetches, r.targets, r.feeds)
    except BaseException:
        new.close()
        raise
    new.snapshot = None  # its state is the failed run's start, not the snapshot's
    p.switch(new, recovered=True)
    took = time.perf_counter() - began
    what = (f"{loss.named()} lost at step {ctl.step + 1} ({why}); re-planned over the "
            f"{len(left)} devices left, the state of step {snap.step} restored and the "
            f"{len(snap.runs)} runs since replayed in {took:.1f} s")
    entry = ctl.recovered(strategy, what)
    log.warning("fastt: %s; %s runs from the failed step on", what, say.label(entry))
