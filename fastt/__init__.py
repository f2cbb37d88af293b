"""fastt: automatic placement, ordering and splitting of TensorFlow graph-mode training.

The scheduling core (``fastt.ir``, ``fastt.costs``, ``fastt.profiler``) imports no TensorFlow;
``fastt.adapters`` is where TensorFlow graphs come in and go out.
"""
import logging

from fastt._version import __version__
from fastt.errors import FasttError

logger = logging.getLogger("fastt")
logger.addHandler(logging.NullHandler())

__all__ = ["__version__", "FasttError", "logger"]
