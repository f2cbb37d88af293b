"""Keep TensorFlow's profiler chatter from fastt's traced steps out of the user's terminal.

Every ``RunOptions(trace_level=FULL_TRACE)`` step makes TensorFlow's C++ profiler log five
lines ("Profiler session initializing", "... started", "... collecting data", "... tear
down", "GPU trace was not collected"), and TensorFlow's C++ log level cannot be changed once
the process runs. ``profiler_chatter_dropped()`` sends file descriptor 2 to a temporary file
for the duration of a traced step, then writes back everything except those lines: anything
else printed meanwhile (a real warning, another thread's output) still reaches stderr, in
order, and the user's own logging settings are untouched.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
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
        with tempfile.TemporaryFile() as buf:
            os.dup2(buf.fileno(), 2)
            try:
                yield
            finally:
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    sys.stderr.flush()
                os.dup2(saved, 2)
                os.close(saved)
                buf.seek(0)
                kept = [line for line in buf.read().splitlines(keepends=True)
                        if not _CHATTER.match(line)]
                if kept:
                    os.write(2, b"".join(kept))
    finally:
        _lock.release()
