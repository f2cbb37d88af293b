"""TensorFlow's profiler chatter is dropped from stderr during a traced step, and every other
line written meanwhile reaches stderr at once, not when the step ends: a line about a lost
server while a step hangs is read while it hangs. (No TensorFlow: the chatter is written
here as TensorFlow's C++ logging writes it.)"""
import os
import threading
import time

from tf_patches.quiet import profiler_chatter_dropped

CHATTER = b"I0000 00:00:1700000000.000000  123 profiler_session.cc:104] Profiler session " \
          b"initializing.\n"


def test_other_lines_pass_at_once_and_the_chatter_is_dropped(capfd):
    with profiler_chatter_dropped():
        os.write(2, CHATTER)
        other = threading.Thread(target=lambda: os.write(2, b"fastt: cluster lost\n"))
        other.start()
        other.join()  # one pipe: a line written between the halves would land inside the line
        os.write(2, b"half a ")
        os.write(2, b"line\n")
        seen, deadline = "", time.monotonic() + 10
        while "cluster lost" not in seen or "half a line" not in seen:
            assert time.monotonic() < deadline, seen
            time.sleep(0.01)
            seen += capfd.readouterr().err
    seen += capfd.readouterr().err
    assert "Profiler session" not in seen and seen.count("\n") == 2, seen
    os.write(2, b"after\n")  # stderr is stderr again
    assert capfd.readouterr().err == "after\n"
