"""The IR's values: ``Op`` and what it is made of (``TensorRef``, ``TensorSpec``, ``OpMeta``),
the data ``Edge`` between two ops, ``GraphMeta``, and an op's JSON form. Immutable where
passes share them; ``fastt.ir.Graph`` holds the ops."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, Mapping, NamedTuple, cast

from fastt import dtypes
from fastt.errors import UnknownDtypeError

Shape = tuple[int | None, ...] | None


class TensorRef(NamedTuple):
    """Output ``index`` of op ``op``."""
    op: str
    index: int  # type: ignore[assignment]  # the output's index, not tuple.index

    def __str__(self) -> str:
        return f"{self.op}:{self.index}"

    @classmethod
    def parse(cls, name: str) -> "TensorRef":
        """The reference named ``op:index``."""
        op, _, index = name.rpartition(":")
        return cls(op, int(index))


class Edge(NamedTuple):
    """A data edge: output ``src_index`` of ``src`` feeds input ``dst_index`` of ``dst``."""
    src: str
    src_index: int
    dst: str
    dst_index: int


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """dtype name, static shape (``None`` = unknown rank, ``None`` dims unknown), bytes.

    ``nbytes`` is derived from dtype and a fully known shape unless given explicitly (a
    RunMetadata allocation size, say); it stays ``None`` where neither is known.
    """
    dtype: str
    shape: Shape = None
    nbytes: int | None = None

    def __post_init__(self) -> None:
        size = dtypes.itemsize(self.dtype)  # raises UnknownDtypeError on an unknown name
        if self.nbytes is None and size is not None and self.fully_defined:
            object.__setattr__(self, "nbytes", size * math.prod(self.dims or ()))

    @property
    def fully_defined(self) -> bool:
        return self.shape is not None and all(d is not None and d >= 0 for d in self.shape)

    @property
    def dims(self) -> tuple[int, ...] | None:
        """The shape when every dimension is known, else None."""
        return cast(tuple[int, ...], self.shape) if self.fully_defined else None


@functools.lru_cache(maxsize=1 << 16)
def tensor_spec(dtype: str, shape: Shape = None) -> TensorSpec:
    """``TensorSpec(dtype, shape)``, one shared instance per value (it is immutable): the
    passes that cut a graph into replicas make hundreds of thousands of the same few."""
    return TensorSpec(dtype, shape)


@dataclass(frozen=True, slots=True)
class OpMeta:
    """fastt's own facts about an op one of its passes made, kept apart from TensorFlow's
    attributes (``Op.attrs``) and never written to a GraphDef."""
    origin: str | None = None  # the user's op this one is a part (or replica) of
    fraction: float = 1.0  # the share of ``origin``'s work it does
    split_of: str | None = None  # the split op this cut or join belongs to
    # On the op that joins the parts of a split op (it has that op's name): how to join,
    # {"kind": "concat"|"sum", "axis": a, "sizes": [...], "total": the sum of the shares the
    # sizes were cut in (parts at another batch size follow those shares)}.
    join: dict[str, Any] | None = None
    folded: str | None = None  # the shape op (its type) folded into this one
    dynamic: bool = False  # a Shape op fastt made: never folded into a constant
    replica: int | None = None  # the data-parallel replica it runs in (all-reduce, mirrors)

    def as_dict(self) -> dict[str, Any]:
        """The fields that differ from the defaults."""
        return {f: getattr(self, f) for f in self.__slots__  # type: ignore[attr-defined]
                if getattr(self, f) != getattr(_NO_META, f)}


_NO_META = OpMeta()


@dataclass(frozen=True)
class GraphMeta:
    """What a graph carries besides its ops, through every pass."""
    library: bytes | None = None  # the GraphDef's function library (serialized), if any
    collections: Mapping[str, list[str]] = field(default_factory=dict)  # e.g. train_op
    # joins of split ops that no op reads any more, by name (the rewriter rebuilds one that
    # the user fetches)
    dropped_joins: Mapping[str, "Op"] = field(default_factory=dict)


@dataclass(slots=True)
class Op:
    """One node of the graph. ``device`` is the device the user requested ("" if none)."""
    name: str
    type: str
    inputs: tuple[TensorRef, ...] = ()
    control_inputs: tuple[str, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    device: str = ""
    colocate_with: tuple[str, ...] = ()
    stateful: bool = False
    is_variable: bool = False
    attrs: dict[str, Any] = field(default_factory=dict)
    node_def: bytes | None = None  # the adapter's opaque payload (a serialized NodeDef)
    meta: OpMeta = _NO_META

    def with_(self, **changes: Any) -> "Op":
        """A copy of this op with some fields changed (``dataclasses.replace``, without its
        cost: passes copy hundreds of thousands of ops)."""
        values = list(_OP_VALUES(self))
        for name, value in changes.items():
            at = _OP_FIELD_AT.get(name)
            if at is None:
                raise TypeError(f"Op has no field {name!r}")
            values[at] = value
        return Op(*values)


_OP_VALUES = attrgetter(*(f.name for f in fields(Op)))  # every field, in __init__'s order
_OP_FIELD_AT = {f.name: k for k, f in enumerate(fields(Op))}


def op_to_dict(op: Op) -> dict[str, Any]:
    """``op`` as JSON (``Graph.to_dict``)."""
    return {
        "name": op.name, "type": op.type, "device": op.device,
        "inputs": [[r.op, r.index] for r in op.inputs],
        "control_inputs": list(op.control_inputs),
        "outputs": [{"dtype": t.dtype, "shape": None if t.shape is None else list(t.shape),
                     "nbytes": t.nbytes} for t in op.outputs],
        "colocate_with": list(op.colocate_with), "stateful": op.stateful,
        "is_variable": op.is_variable, "attrs": op.attrs,
        **({"meta": op.meta.as_dict()} if op.meta != _NO_META else {}),
    }


def op_from_dict(d: dict[str, Any]) -> Op:
    """The op ``op_to_dict`` wrote; an unknown dtype is refused by name."""
    for i, t in enumerate(d.get("outputs", [])):
        if not dtypes.is_known(str(t.get("dtype"))):
            raise UnknownDtypeError(
                f"op {d.get('name')!r} output {i} has unknown dtype {t.get('dtype')!r}")
    return Op(
        name=d["name"], type=d["type"], device=d.get("device", ""),
        inputs=tuple(TensorRef(o, int(i)) for o, i in d.get("inputs", [])),
        control_inputs=tuple(d.get("control_inputs", [])),
        outputs=tuple(TensorSpec(t["dtype"], None if t["shape"] is None else tuple(t["shape"]),
                                 t.get("nbytes")) for t in d.get("outputs", [])),
        colocate_with=tuple(d.get("colocate_with", [])), stateful=d.get("stateful", False),
        is_variable=d.get("is_variable", False), attrs=dict(d.get("attrs", {})),
        meta=OpMeta(**d["meta"]) if d.get("meta") else _NO_META,
    )


def writes_variable(op: Op) -> bool:
    """Whether ``op`` writes a variable (an optimizer's apply, an assign, a scatter)."""
    return op.stateful and any(k in op.type for k in ("Apply", "Assign", "Scatter"))
