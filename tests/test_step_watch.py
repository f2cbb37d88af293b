"""A server lost while a step runs is named within seconds (no TensorFlow: the servers are
asked over gRPC, here a port where nothing listens)."""
import logging
import socket
import threading
import time

from fastt.cluster import health
from fastt.cluster.health import Returns, StepWatch, Watch
from fastt.cluster.spec import parse_cluster_spec


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_lost_while_a_step_runs_is_named_at_once(caplog):
    spec = parse_cluster_spec(f"127.0.0.1:{closed_port()}")
    lost = threading.Event()
    names = []
    watch = StepWatch(Watch(spec, interval=0.2, timeout=2.0),
                      lambda said: (names.append(said), lost.set()))
    caplog.set_level(logging.WARNING, logger="fastt")
    watch.started()  # a step that does not end
    began = time.monotonic()
    assert lost.wait(10.0), "not named within 10 s"
    assert time.monotonic() - began < 5.0
    assert "worker 0 (127.0.0.1:" in names[0] and "does not answer" in names[0]
    assert "while a step runs" in caplog.text


def test_short_steps_are_not_checked():
    spec = parse_cluster_spec(f"127.0.0.1:{closed_port()}")
    called = []
    watch = StepWatch(Watch(spec, interval=0.2, timeout=2.0), called.append)
    for _ in range(10):  # steps shorter than the interval
        watch.started()
        time.sleep(0.05)
        watch.ended()
        time.sleep(0.05)
    assert called == []


def test_servers_gone_that_answer_again_are_handed_over_once(monkeypatch):
    spec = parse_cluster_spec("127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
    answering = set()
    monkeypatch.setattr(health, "unanswered", lambda tasks, timeout: [
        (t, "UNAVAILABLE") for t in tasks if t not in answering])
    watch = Watch(spec, interval=0.05)
    returns = Returns(watch)
    assert returns.take() == []  # none gone: no thread
    watch.forget(spec.tasks[1:])
    assert returns.take() == []
    answering.add(spec.tasks[2])
    deadline = time.monotonic() + 10
    back = []
    while not back and time.monotonic() < deadline:
        time.sleep(0.05)
        back = returns.take()
    assert back == [spec.tasks[2]]
    assert watch.tasks == [spec.tasks[0], spec.tasks[2]] and watch.gone == {spec.tasks[1]}
    time.sleep(0.2)
    assert returns.take() == []  # handed over once
