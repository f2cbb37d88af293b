"""Memory model: persistent bytes (variables, optimizer slots) and output bytes of every op."""
from __future__ import annotations

import math
from typing import Any, Mapping

from fastt import dtypes
from fastt.ir import Graph, Op, TensorRef
from fastt.op_types import ALIASING_TYPES


def _variable_bytes(op: Op) -> int:
    """Size of the variable an op defines, from its ``shape``/``dtype`` attrs or its output."""
    shape = op.attrs.get("shape")
    dtype = op.attrs.get("dtype")
    if isinstance(shape, list) and dtype and all(isinstance(d, int) and d >= 0 for d in shape):
        size = dtypes.itemsize(str(dtype), where=f"variable {op.name!r}")
        if size is not None:
            return size * math.prod(shape)
    return sum(t.nbytes or 0 for t in op.outputs if t.dtype != "resource")


class MemoryModel:
    """Per-op persistent and output bytes, and per-device capacities.

    Outputs are sized from static shapes and refined with RunMetadata allocation sizes; an
    output is live from its producer's start until its last consumer on that device finishes
    (the simulator and DPOS use that rule), persistent bytes for the whole step.
    """

    def __init__(self, persistent: Mapping[str, int] | None = None,
                 outputs: Mapping[str, int] | None = None,
                 capacity: Mapping[str, int] | None = None,
                 aliases: set[str] | None = None) -> None:
        self.persistent: dict[str, int] = dict(persistent or {})
        self.outputs: dict[str, int] = dict(outputs or {})
        self.capacity: dict[str, int] = dict(capacity or {})
        self.aliases: set[str] = set(aliases or ())  # ops whose outputs share a buffer

    @classmethod
    def from_graph(cls, graph: Graph) -> "MemoryModel":
        persistent = {op.name: _variable_bytes(op) for op in graph if op.is_variable}
        aliases = {op.name for op in graph if op.type in ALIASING_TYPES}
        outputs = {op.name: 0 if op.name in aliases else sum(t.nbytes or 0 for t in op.outputs)
                   for op in graph}
        return cls(persistent, outputs, aliases=aliases)

    def refine(self, output_bytes: Mapping[TensorRef, int]) -> None:
        """Replace static sizes by measured allocation sizes (e.g. ``Profile.output_bytes``)."""
        per_op: dict[str, int] = {}
        for ref, nbytes in output_bytes.items():
            per_op[ref.op] = per_op.get(ref.op, 0) + int(nbytes)
        for op, nbytes in per_op.items():
            if op not in self.persistent and op not in self.aliases:
                self.outputs[op] = max(self.outputs.get(op, 0), nbytes)

    def op_bytes(self, op: str) -> int:
        """Bytes an op needs on its device: persistent plus its outputs."""
        return self.persistent.get(op, 0) + self.outputs.get(op, 0)

    def total_persistent(self) -> int:
        return sum(self.persistent.values())

    def to_dict(self) -> dict[str, Any]:
        return {"persistent": self.persistent, "outputs": self.outputs,
                "capacity": self.capacity, "aliases": sorted(self.aliases)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MemoryModel":
        return cls(data.get("persistent"), data.get("outputs"), data.get("capacity"),
                   set(data.get("aliases", [])))
