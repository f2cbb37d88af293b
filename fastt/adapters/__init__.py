"""TensorFlow at the edges: graphs in and out of the IR, profiled runs, transfer probes.

These modules import TensorFlow; the scheduling core (``fastt.ir``, ``fastt.costs``,
``fastt.profiler``) does not.
"""
