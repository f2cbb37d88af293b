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
import threading
from typing import TYPE_CHECKING, Any, Sequence

from fastt.cluster.health import Returns, Watch
from fastt.cluster.spec import Task, on_tasks
from fastt.errors import DoesNotFit, WorkerLostError
from fastt.plugin import elastic, remote
from fastt.plugin import messages as say
from fastt.plugin.state import unsaved
from fastt.sched.sim.problem import Device
from fastt.sched import registry

from tf_patches import session_hook as hook

if TYPE_CHECKING:
    from fastt.adapters.engine import Engine
    from fastt.plugin.activation import Running
    from fastt.plugin.backend import PluginBackend
    from fastt.plugin.guard import Guard
    from fastt.plugin.settings import Settings

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


def find_loss(watch: Watch | None, devices: Sequence[str], given_up: Sequence[Task] = ()
              ) -> Loss:
    """Of ``devices``, those of a server of ``watch``'s cluster that does not answer now, or
    that a run was ``given_up`` for (none of this process's devices can be lost: no
    cluster, no loss)."""
    if watch is None:
        return Loss([], [])
    tasks = watch.lost_tasks(given_up)
    lost = [d for d in devices if on_tasks(d, tasks)]
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
    # an input pipeline that cannot move runs in the script's own session (``InputStage``)
    unmovable = bool(p.graph.get_collection("queue_runners") or unsaved(p.graph)[0]) \
        if cur is p.user else bool(p.inputs.staged) and loss.master

    def stuck(what: str, cause: BaseException | None = error) -> WorkerLostError:
        path = elastic.write_checkpoint(snap.state, tempfile.mkdtemp(prefix="fastt-"))
        names = "" if not left else " (left: " + ", ".join(d.name for d in left) + ")"
        lost = WorkerLostError(
            f"{loss.named()} lost ({why}): {what}{names}; the training state of step "
            f"{snap.step} is in the TensorFlow checkpoint {path}, which the script's Saver "
            "restores")
        lost.__cause__ = cause
        return lost
    if not left:
        raise stuck("every device fastt planned over is lost")
    if unmovable:
        raise stuck("the script's input pipeline runs in its own session, which was lost")
    if p.watch is not None and loss.tasks:
        p.watch.forget(loss.tasks)
        p.lose_servers(loss)
    backend.forget_devices(loss.devices)
    running = cur.strategy
    strategy = e.on_first_device()  # the step on the first device left, unless re-planned
    onto = f"moved onto {left[0].name}"
    if running is not None and len(left) > 1 and running.name in registry.names() and \
            e.models is not None:  # a cached plan's run has none: it did not profile
        try:
            strategy = backend.plan(running.name)
        except DoesNotFit as fit:
            raise stuck(f"no plan over the devices left fits their memory ({fit})", fit)
        onto = f"re-planned over the {len(left)} devices left"
    elif len(left) == 1 and (misfit := e.original_misfit()):
        raise stuck(f"the training step does not fit the one device left ({misfit})")
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
    what = (f"{loss.named()} lost at step {ctl.step + 1} ({why}); {onto}, the state of "
            f"step {snap.step} restored and the {len(snap.runs)} runs since replayed in "
            f"{took:.1f} s")
    entry = ctl.recovered(strategy, what)
    log.warning("fastt: %s; %s runs from the failed step on", what, say.label(entry))


class Surviving:
    """The session plugin's side of a loss (``SessionPlugin``, whose state it shares)."""
    lock: threading.RLock
    snapshots: elastic.Snapshots | None
    backend: "PluginBackend | None"
    engine: "Engine"
    watch: Watch | None
    returns: Returns | None
    guard: "Guard"
    current: "Running"
    target: str
    config: Any
    settings: "Settings"
    user_lost: str

    def _survive(self) -> bool | None:
        with self.lock:
            return self.survived(None, None)

    def survived(self, cur: Any, error: Exception | None) -> bool | None:
        """After ``error`` on the graph ``cur`` runs (or between runs: both None): when
        devices or servers are lost (``find_loss``), training goes on without them where it
        can (``recover``; a lost server the running graph does not use is dropped from
        later plans); whether it does (a failed call then runs again), None when nothing
        is lost. Under ``lock``."""
        snaps, backend = self.snapshots, self.backend
        if snaps is None or error is not None and (
                cur is not self.current or not isinstance(error, remote.STEP_ERRORS)):
            return False
        loss = self.find_loss([d.name for d in self.engine.devices])
        if not loss:
            return None
        if backend is not None and snaps.last is not None and \
                (loss.master or set(loss.devices) & self._running_devices()):
            recover(backend, loss, error)
            return True
        if loss.master or error is not None:
            return False  # the script's own session was on it, or nothing fastt holds was
        assert self.watch is not None
        self.watch.forget(loss.tasks)
        self.lose_servers(loss)
        if backend is not None:
            backend.forget_devices(loss.devices)
        log.warning("fastt: %s lost; training goes on, and fastt plans without it",
                    loss.named())
        return True

    def readmit(self) -> list[Task]:
        """The lost servers that answered again since last asked (restarted, or resumed once
        the run left on them was given up), taken back into the cluster the next plans and
        sessions use (the running graph's session does not use them)."""
        if self.returns is None:
            return []
        with self.lock:
            back = self.returns.take()
            if back:
                self.guard.given_up = [t for t in self.guard.given_up if t not in back]
                log.warning("fastt: %s answer%s again; the next plan takes %s in",
                            ", ".join(map(str, back)), "s" if len(back) == 1 else "",
                            "it" if len(back) == 1 else "them")
        return back

    def devices_of(self, tasks: list[Task]) -> list[Device]:
        """The devices to plan over on ``tasks``, servers not planned over before."""
        s = self.settings
        return remote.task_devices(self.target, self.config, tasks, s.devices,
                                   s.device_memory_mb * 2 ** 20)

    def _running_devices(self) -> set[str]:
        s = self.current.strategy
        return set(s.placement.values()) if s is not None else \
            {d.name for d in self.engine.devices[:1]}

    def find_loss(self, devices: list[str]) -> Loss:
        """Of ``devices``, those of a server that does not answer, and the servers (on
        fastt's cluster; none of this process's devices can be lost)."""
        return find_loss(self.watch, devices, self.guard.given_up)

    def lose_servers(self, loss: Loss) -> None:
        """Training goes on without the servers of ``loss`` (``Watch.forget`` done): the
        sessions open now close without calling them; a new master when it was one."""
        hook.forsake(self.target)
        if loss.master:
            assert self.watch is not None
            self.target = self.watch.target
            self.user_lost = f"the script's own session ran on the lost master ({loss.named()})"
