"""Where the loopback bind shim is (``native/bind_loopback.c``, built at install).

TensorFlow's gRPC server listens on every interface; a local cluster's workers start with this
shim in ``LD_PRELOAD`` so that they listen on 127.0.0.1 only.
"""
from __future__ import annotations

import glob
import os
import sys


def shim_path() -> str | None:
    """The built shim library, wherever ``tf_patches`` is installed; None when not built."""
    seen = set()
    for base in [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))] + sys.path:
        d = os.path.join(base or os.curdir, "tf_patches")
        if d in seen:
            continue
        seen.add(d)
        found = sorted(glob.glob(os.path.join(d, "_bind_loopback*.so")))
        if found:
            return found[0]
    return None
