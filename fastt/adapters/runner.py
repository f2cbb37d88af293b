"""Run profiled training steps through a TensorFlow session and collect their RunMetadata."""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from fastt.costs import CostModels, MemoryModel
from fastt.ir import Graph
from fastt.profiler import Profile, profile
from tf_patches.quiet import profiler_chatter_dropped

_tf1 = tf.compat.v1


def traced_run(sess: Any, fetches: Any, feed_dict: Any = None) -> tuple[Any, Any]:
    """One ``sess.run`` with a full trace; returns (its result, its RunMetadata)."""
    meta = _tf1.RunMetadata()
    options = _tf1.RunOptions(trace_level=_tf1.RunOptions.FULL_TRACE)
    with profiler_chatter_dropped():
        result = sess.run(fetches, feed_dict=feed_dict, options=options, run_metadata=meta)
    return result, meta


def profile_steps(sess: Any, graph: Graph, fetches: Any, feed_dict: Any = None,
                  steps: int = 5, warmup: int = 1) -> list[Profile]:
    """Run ``warmup`` untraced then ``steps`` traced steps; one ``Profile`` per traced step."""
    for _ in range(warmup):
        sess.run(fetches, feed_dict=feed_dict)
    return [profile(traced_run(sess, fetches, feed_dict)[1], graph) for _ in range(steps)]


def cost_models_from(graph: Graph, profiles: list[Profile],
                     capacity: dict[str, int] | None = None) -> CostModels:
    """Cost models filled from profiles of ``graph``, one compute update per profile."""
    models = CostModels(memory=MemoryModel.from_graph(graph))
    models.memory.capacity.update(capacity or {})
    for p in profiles:
        models.update(p)
    return models
