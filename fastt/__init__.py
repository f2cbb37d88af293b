"""fastt: automatic placement, ordering and splitting of TensorFlow graph-mode training.

The core (``fastt.ir``, ``fastt.profiler``, ``fastt.costs``, ``fastt.passes``, ``fastt.sched``,
``fastt.inspect``) imports no TensorFlow; ``fastt.adapters`` is where TensorFlow graphs come in
and go out, and ``tf_patches`` the only code that reaches into TensorFlow's internals.
"""
import logging

from fastt._version import __version__
from fastt.errors import FasttError

logger = logging.getLogger("fastt")
logger.addHandler(logging.NullHandler())

__all__ = ["__version__", "FasttError", "logger"]
