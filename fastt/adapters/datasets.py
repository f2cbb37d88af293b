"""What a tf.data input pipeline yields and holds, read from the graph that builds it, before it
runs: the batch size, which a training step's memory depends on where the graph leaves the
batch dimension unknown (``dataset.batch(n)`` without ``drop_remainder``), and the tensors its
sources hold once it runs (``from_tensor_slices`` of arrays the script made: constants of the
graph that TensorFlow's allocator holds for as long as the iterator lives)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2

# a batching dataset -> the index of its batch size input
BATCHING = {"BatchDataset": 1, "BatchDatasetV2": 1, "PaddedBatchDataset": 1,
            "PaddedBatchDatasetV2": 1, "ParallelBatchDataset": 1}
# datasets after which the batch is no longer the one their input made
REBATCHING = frozenset({"UnbatchDataset", "RebatchDataset", "RebatchDatasetV2",
                        "WindowDataset", "FlatMapDataset", "InterleaveDataset",
                        "ParallelInterleaveDatasetV4", "ChooseFastestBranchDataset",
                        "ExperimentalUnbatchDataset"})
# datasets made of tensors (their inputs), which they hold
SOURCES = frozenset({"TensorSliceDataset", "TensorDataset", "SparseTensorSliceDataset"})
_NEXT = ("IteratorGetNext", "IteratorGetNextSync")
_WALK = 64  # datasets followed up a pipeline, at most


def _base(name: str) -> str:
    return name.lstrip("^").split(":")[0]


@dataclass(frozen=True)
class Pipeline:
    """What one iterator's dataset yields and holds, as its graph says."""
    batch: int | None  # the batch size (None: not said, or not one)
    held_bytes: int  # the tensors its sources hold


def iterator_batches(graph_def: graph_pb2.GraphDef) -> dict[str, int]:
    """Each ``IteratorGetNext`` of ``graph_def`` -> the batch size of the dataset it reads,
    where the graph says it (``iterator_pipelines``)."""
    return {n: p.batch for n, p in iterator_pipelines(graph_def).items()
            if p.batch is not None}


def iterator_pipelines(graph_def: graph_pb2.GraphDef) -> dict[str, Pipeline]:
    """Each ``IteratorGetNext`` of ``graph_def`` -> its dataset: a one-shot iterator's dataset
    function, or the datasets every ``MakeIterator`` of its iterator starts it on (a
    reinitializable iterator: its batch only when they all batch alike, what they hold
    summed). The batch is the first batching dataset's up the pipeline, its size a constant,
    with no re-batching after it; what it holds, the constants its first chain of datasets
    starts from. O(nodes)."""
    nodes = {n.name: n for n in graph_def.node}
    makes: dict[str, list[str]] = {}
    for n in graph_def.node:
        if n.op == "MakeIterator" and len(n.input) >= 2:
            makes.setdefault(_base(n.input[1]), []).append(_base(n.input[0]))
    functions = {f.signature.name: f for f in graph_def.library.function}
    out: dict[str, Pipeline] = {}
    for n in graph_def.node:
        if n.op not in _NEXT or not n.input:
            continue
        it = nodes.get(_base(n.input[0]))
        if it is None:
            continue
        if it.op == "OneShotIterator":
            f = functions.get(it.attr["dataset_factory"].func.name)
            if f is None or not f.signature.output_arg:
                continue
            table = {d.name: d for d in f.node_def}
            found = [_walk(table, _base(f.ret[f.signature.output_arg[0].name]))]
        else:
            table = nodes
            found = [_walk(nodes, d) for d in makes.get(it.name, [])]
        if not found:
            continue
        sizes = {b for b, _ in found}
        out[n.name] = Pipeline(sizes.pop() if len(sizes) == 1 else None,
                               sum(h for _, h in found))
    return out


def _walk(table: Mapping[str, node_def_pb2.NodeDef], name: str) -> tuple[int | None, int]:
    """Up the pipeline from dataset ``name`` (looked up in ``table``): its batch size (None:
    not found) and the bytes of the constants its source holds."""
    batch: int | None = None
    rebatched = False
    for _ in range(_WALK):
        node = table.get(name)
        if node is None:
            break
        if node.op in SOURCES:
            return (None if rebatched else batch), sum(
                _bytes(table.get(_base(i))) for i in node.input if not i.startswith("^"))
        if node.op in REBATCHING and batch is None:  # the batches of what it reads are not
            rebatched = True  # the ones yielded
        elif node.op in BATCHING and batch is None and not rebatched:
            batch = _constant(table.get(_base(node.input[BATCHING[node.op]])))
        if not node.input:
            break
        name = _base(node.input[0])  # a transformation's first input is the dataset it reads
    return (None if rebatched else batch), 0


def _constant(node: node_def_pb2.NodeDef | None) -> int | None:
    if node is None or node.op != "Const":
        return None
    value: Any = tf.make_ndarray(node.attr["value"].tensor)
    return int(value) if value.shape == () and int(value) > 0 else None


def _bytes(node: node_def_pb2.NodeDef | None) -> int:
    """The bytes of a constant's tensor (0 for anything else, or a string tensor)."""
    if node is None or node.op != "Const":
        return 0
    t = node.attr["value"].tensor
    dtype = tf.dtypes.as_dtype(t.dtype)
    if dtype == tf.string:
        return 0
    return dtype.size * math.prod(d.size for d in t.tensor_shape.dim)
