"""Keep TensorFlow's profiler chatter from fastt's traced steps out of the user's terminal.

Every ``RunOptions(trace_level=FULL_TRACE)`` step makes TensorFlow's C++ profiler log five
lines ("Profiler session initializing", "... started", "... collecting data", "... tear
down", "GPU trace was not collected"), and TensorFlow's C++ log level cannot be changed once
the process runs. ``profiler_chatter_dropped()`` sends file descriptor 2 into a pipe for the
duration of a traced step, and a thread passes every line but those on to stderr as it comes:
anything else printed meanwhile (a real warning, another thread's output, fastt's line about
a lost server while the step hangs) reaches stderr at once, and the user's own logging
settings are untouched.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from typing import Iterator

_CHATTER = re.compile(rb"^[IW]\d{4} [\d:.]+\s+\d+ (profiler_session\.cc|xplane_to_step_stats"
                      rb"\.cc|device_tracer\.cc|profiler_lock\.cc)[:\]]")
_lock = threading.Lock()


@contextlib.contextmanager
def profiler_chatter_dropped() -> Iterator[None]:
    """Within this block, TensorFlow's profiler lines on stderr are dropped (see above)."""
    if not _lock.acquire(blocking=False):  # nested or concurrent: the outer block filters
        yield
        return
    try:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError, AttributeError):  # no real stderr (embedded, closed)
            yield
            return
        read, write = os.pipe()
        forward = threading.Thread(target=_forward, args=(read, saved), daemon=True,
                                   name="fastt-stderr")
        forward.start()
        os.dup2(write, 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(write)  # the pipe's last writer: the thread reads to its end
            forward.join(timeout=5.0)
            if not forward.is_alive():
                os.close(saved)
    finally:
        _lock.release()


def _forward(read: int, out: int) -> None:
    """Each line from ``read`` but the profiler's written to ``out``, as it comes."""
    pending = b""
    try:
        while True:
            chunk = os.read(read, 65536)
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            kept = [ln + b"\n" for ln in lines if not _CHATTER.match(ln)]
            if kept:
                os.write(out, b"".join(kept))
        if pending and not _CHATTER.match(pending):
            os.write(out, pending)
    except OSError:
        pass
    finally:
        os.close(read)
