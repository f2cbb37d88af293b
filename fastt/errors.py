"""Exceptions raised by fastt. Every message names the input that was wrong."""


class FasttError(Exception):
    """Base class of every error fastt raises on purpose."""


class GraphFormatError(FasttError):
    """A graph file or object could not be read as a TensorFlow graph."""


class UnknownDtypeError(FasttError):
    """An op produces a tensor whose dtype fastt does not know."""


class GraphStructureError(FasttError):
    """The graph is not what the operation needs (a cycle outside a loop, a dangling input...)."""


class DoesNotFit(FasttError):
    """A placement or a strategy needs more memory than the devices have."""


class Declined(FasttError):
    """A strategy that does not take this graph (the message says why)."""


class NoBatch(FasttError):
    """Data parallelism cannot share the graph's batch (none found, or too small)."""


class ProfileError(FasttError):
    """A RunMetadata could not be turned into cost samples."""


class CostModelError(FasttError):
    """A cost model was asked for something it cannot give, or could not be loaded."""


class ClusterError(FasttError):
    """A local or remote TensorFlow cluster could not be started, reached or stopped."""


class WorkerLostError(ClusterError):
    """A server of the cluster died or stopped answering: training cannot go on there."""
