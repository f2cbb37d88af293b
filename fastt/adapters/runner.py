"""One traced ``Session.run`` and its RunMetadata."""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from fastt.profiler import TRACING
from tf_patches.quiet import profiler_chatter_dropped

_tf1 = tf.compat.v1


def traced_run(sess: Any, fetches: Any, feed_dict: Any = None) -> tuple[Any, Any]:
    """One ``sess.run`` with a full trace; returns (its result, its RunMetadata)."""
    meta = _tf1.RunMetadata()
    options = _tf1.RunOptions(trace_level=_tf1.RunOptions.FULL_TRACE)
    with TRACING, profiler_chatter_dropped():
        result = sess.run(fetches, feed_dict=feed_dict, options=options, run_metadata=meta)
    return result, meta
