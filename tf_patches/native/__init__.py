"""The C and C++ libraries ``pip install`` builds from this folder, and where they ended up.

``bind_loopback.c`` (``_bind_loopback``): an ``LD_PRELOAD`` shim that makes TensorFlow's gRPC
server, which listens on every interface, listen on 127.0.0.1 for local clusters.
``priority_executor.cc`` (``_priority_executor``): fastt's executor plugin
(``tf_patches.priority_executor``).
"""
from __future__ import annotations

import glob
import os
import sys


def built(stem: str) -> str | None:
    """The built library ``tf_patches/<stem>*.so``, wherever ``tf_patches`` is installed
    (this checkout first, then ``sys.path``); None when it was not built."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for d in [here] + [os.path.join(p or os.curdir, "tf_patches") for p in sys.path]:
        found = sorted(glob.glob(os.path.join(d, stem + "*.so")))
        if found:
            return found[0]
    return None
