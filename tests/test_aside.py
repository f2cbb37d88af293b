"""Work on a second core (``fastt.aside``): the same result as a call here, whatever befalls
the child."""
import os
import time

import pytest

from fastt import aside as aside_mod
from fastt.aside import Aside

forks = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs a second core")


@forks
def test_the_work_is_done_in_a_second_process_and_its_result_returned():
    here = os.getpid()
    job = Aside(lambda: (os.getpid(), [i * i for i in range(1000)]))
    pid, squares = job.result()
    assert pid != here
    assert squares == [i * i for i in range(1000)]
    assert job.result()[0] == pid  # read once, kept


def test_with_one_core_the_work_is_done_here_when_asked(monkeypatch):
    monkeypatch.setattr(aside_mod.os, "cpu_count", lambda: 1)
    calls = []
    job = Aside(lambda: calls.append(os.getpid()) or "done")
    assert calls == []  # not before it is asked for
    assert job.result() == "done"
    assert calls == [os.getpid()]


@forks
def test_an_error_in_the_child_is_raised_by_the_call_here():
    def fails():
        raise ValueError(f"bad graph in {os.getpid()}")
    job = Aside(fails)
    with pytest.raises(ValueError, match=f"bad graph in {os.getpid()}$"):
        job.result()


@forks
def test_a_child_that_dies_leaves_the_work_to_this_process():
    here = os.getpid()

    def dies_there():
        if os.getpid() != here:
            os._exit(9)
        return "done here"
    assert Aside(dies_there).result() == "done here"


@forks
def test_a_child_that_stops_working_is_stopped_and_the_work_done_here(monkeypatch):
    monkeypatch.setattr(aside_mod, "IDLE_S", 0.5)
    here = os.getpid()

    def hangs_there():
        if os.getpid() != here:
            time.sleep(60)  # no processor time: taken as hung
        return "done here"
    t0 = time.monotonic()
    assert Aside(hangs_there).result() == "done here"
    assert time.monotonic() - t0 < 30


@forks
def test_an_answer_that_cannot_be_sent_back_is_worked_out_here():
    here = os.getpid()
    job = Aside(lambda: (lambda: here) if os.getpid() != here else "done here")
    assert job.result() == "done here"


@forks
def test_work_never_asked_for_leaves_no_process_behind():
    job = Aside(lambda: time.sleep(60))
    proc = job._proc
    assert proc is not None and proc.is_alive()
    del job
    assert not proc.is_alive()


@forks
def test_what_the_work_logs_is_said_once_here_with_its_answer(caplog):
    import logging
    here = os.getpid()

    def says():
        logging.getLogger("fastt.costs").info("estimated %d ops", 3)
        return os.getpid()
    with caplog.at_level(logging.INFO, logger="fastt"):
        job = Aside(says)
        assert job.result() != here
    assert [r.getMessage() for r in caplog.records] == ["estimated 3 ops"]


@forks
def test_a_failed_childs_lines_are_not_said_twice(caplog):
    import logging
    here = os.getpid()

    def says_then_fails_there():
        logging.getLogger("fastt").warning("placeholders have unknown dimensions")
        if os.getpid() != here:
            raise RuntimeError("there")
        return "done here"
    with caplog.at_level(logging.INFO, logger="fastt"):
        assert Aside(says_then_fails_there).result() == "done here"
    assert [r.getMessage() for r in caplog.records] == ["placeholders have unknown dimensions"]
