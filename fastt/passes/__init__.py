"""Graph rewrites on the IR: each pass reads a ``Graph`` and returns a new one.

Splitting an op (``splitting``, by the rules of ``split_rules``), data parallelism
(``data_parallel`` with ``replicas``, ``sync_batch_norm``, ``ring`` and ``allreduce``), the
hybrid layouts (``hybrid``) and the variable-update order a rewrite keeps (``update_order``).
Imports no TensorFlow and nothing of the scheduler.
"""
