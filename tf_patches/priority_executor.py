"""fastt's priority executor (``native/priority_executor.cc``, compiled by ``pip install``).

``load()`` loads the library into TensorFlow once; afterwards a session whose
``ConfigProto.experimental.executor_type`` is ``EXECUTOR_TYPE`` runs each graph partition with
it, ready ops taken highest ``PRIORITY_ATTR`` first. Where it was not built, or was built for
another TensorFlow, ``load()`` says why (one log line) and returns False.
"""
from __future__ import annotations

import logging
import re

from tf_patches.native import built

log = logging.getLogger("fastt")
EXECUTOR_TYPE = "FASTT_PRIORITY"
PRIORITY_ATTR = "_fastt_priority"
_MARK = re.compile(rb"FASTT_BUILT_FOR_TF=([^;\x00]+);")
_state: dict[str, object] = {}


def library_path() -> str | None:
    """The built library; None when it was not built."""
    return built("_priority_executor")


def built_for(path: str) -> str | None:
    """The TensorFlow version the library at ``path`` was compiled against."""
    with open(path, "rb") as f:
        m = _MARK.search(f.read())
    return m.group(1).decode() if m else None


def load() -> bool:
    """Load the executor into this process (once); whether it is available."""
    if "ok" in _state:
        return bool(_state["ok"])
    import tensorflow as tf

    path = library_path()
    why = ""
    if path is None:
        why = "it was not built at install (no C++ compiler or TensorFlow headers then)"
    elif built_for(path) != tf.__version__:
        why = (f"{path} was built for TensorFlow {built_for(path)}, this is {tf.__version__}; "
               "reinstall fastt")
    else:
        try:
            tf.load_library(path)
        except Exception as e:  # noqa: BLE001 - a library TensorFlow refuses
            why = f"TensorFlow could not load {path} ({type(e).__name__}: {e})"
    _state["ok"] = not why
    if why:
        log.info("fastt: no priority executor: %s; op order is enforced with control "
                 "dependencies", why)
    return not why
