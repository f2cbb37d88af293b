"""Queue-runner input pipelines, and iterators whose position cannot be saved, stay where
they run: in the user's session.

A classic TF1 input pipeline (``string_input_producer``, a reader, ``tf.train.batch`` or
``shuffle_batch``) fills queues from threads that ``QueueRunner``s start on the user's
session. A queue cannot be moved to another session (its elements live in its kernel), so
fastt leaves the whole input stage there: the runners' own runs (enqueue, close, cancel) go
to the user's session as before, and a run of fastt's graph that reads a runner's queue
(a dequeue, a size) first takes those values from the user's session and feeds them in. In
fastt's graphs each such read is an ``IdentityN`` of placeholders under its name: fed, it can
never wait on the inner session's empty queue, even where grappler turns a use of it into a
control dependency (which would run the op itself).
Each element is dequeued once, by the run that uses it, whichever graph serves it: nothing
is skipped or repeated across an activation or a rollback.

A ``tf.data`` iterator normally moves with the state (its position serialized by
TensorFlow), but one over a Python generator or ``py_func`` cannot be serialized: such an
iterator is ``stage``d like a queue, its ``IteratorGetNext`` read in the user's session and fed
in, its initializer run there; the same iterator object feeds every graph.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from fastt.plugin.state import RunFanIn

_tf1 = tf.compat.v1
GET_NEXT = frozenset({"IteratorGetNext", "IteratorGetNextSync"})


class InputStage:
    """The queue runners of one graph: which runs are theirs, and which queue reads a run
    of fastt's graph takes from the user's session."""

    def __init__(self, graph: tf.Graph, fan_in: RunFanIn) -> None:
        self.graph, self.fan_in = graph, fan_in
        self._version = -1
        self.runner_ops: set[str] = set()
        self._readers: dict[str, tf.Operation] = {}
        self._reads: dict[Any, list[tf.Tensor]] = {}
        self.staged: set[str] = set()  # iterators (op names) that stay in the user's session

    def stage(self, iterators: set[str]) -> None:
        """Keep ``iterators`` in the user's session from now on."""
        if iterators - self.staged:
            self.staged |= iterators
            self._version = -1

    def _refresh(self) -> None:
        if self._version == self.graph.version:
            return
        self._version = self.graph.version
        runners = self.graph.get_collection(_tf1.GraphKeys.QUEUE_RUNNERS)
        ops: set[str] = set()
        queues = set()
        for qr in runners:
            queues.add(qr.queue.queue_ref.op.name)
            ops.update(op.name for op in qr.enqueue_ops)
            ops.update(op.name for op in (qr.close_op, qr.cancel_op) if op is not None)
        readers = {op.name: op for op in self.graph.get_operations()
                   if op.inputs and op.inputs[0].op.name in queues
                   and op.name not in ops and op.outputs}
        for op in self.graph.get_operations():  # the staged iterators' reads and inits
            source = op.inputs[-1 if op.type == "MakeIterator" else 0].op.name \
                if op.inputs else ""
            if source in self.staged and op.type == "MakeIterator":
                ops.add(op.name)
            elif source in self.staged and op.type in GET_NEXT:
                readers[op.name] = op
        self.runner_ops, self._readers = ops, readers
        self._reads = {}

    @property
    def active(self) -> bool:
        self._refresh()
        return bool(self.runner_ops)

    def owns(self, names: list[str]) -> bool:
        """Whether a run of ``names`` (fetches and targets) is a queue runner's own."""
        self._refresh()
        return bool(names) and all(n.split(":")[0] in self.runner_ops for n in names)

    def reads(self, fetches: list[str], targets: list[str], feeds: list[str]
              ) -> list[tf.Tensor]:
        """The outputs of the runners' queue reads (dequeues, sizes) a run executes (none
        when the run already feeds them: a retry)."""
        self._refresh()
        if not self._readers:
            return []
        key = (tuple(fetches), tuple(targets), tuple(sorted(feeds)))
        if key not in self._reads:
            ran = self.fan_in(fetches, targets, feeds)
            self._reads[key] = [t for name in sorted(ran & set(self._readers))
                                for t in self._readers[name].outputs]
        return [t for t in self._reads[key] if fed_name(t.name) not in feeds]

    def placeholders(self, gd: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
        """``gd`` with each queue read replaced by an ``IdentityN`` of placeholders
        (``fed_name`` of each output), on the read's device."""
        self._refresh()
        if not self._readers:
            return gd
        out = graph_pb2.GraphDef()
        out.CopyFrom(gd)
        for node in out.node:
            op = self._readers.get(node.name)
            if op is None:
                continue
            types = [t.dtype.as_datatype_enum for t in op.outputs]
            for i, t in enumerate(op.outputs):
                ph = out.node.add(name=fed_name(t.name).split(":")[0], op="Placeholder",
                                  device=node.device)
                ph.attr["dtype"].type = types[i]
            del node.input[:]
            node.input.extend(fed_name(t.name) for t in op.outputs)
            keep = {k: v for k, v in node.attr.items() if k.startswith("_")}
            node.op = "IdentityN"
            node.ClearField("attr")
            node.attr["T"].list.type.extend(types)
            for k, v in keep.items():
                node.attr[k].CopyFrom(v)
        return out


def fed_name(tensor: str) -> str:
    """The placeholder fastt's graphs feed output ``tensor`` of a queue read through."""
    op, _, index = tensor.rpartition(":")
    return f"{op}/fastt_fed{index}:0"
