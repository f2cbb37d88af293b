"""A ``Strategy`` as a JSON document and back, graph included: what the plan cache stores, so
that a later run activates the same plan without planning it again.

The document is ``Strategy.to_dict`` plus the strategy's graph (``Graph.to_dict`` with each
op's opaque payload and the graph's function library in base64, and the joins a split left
unread), exactly what the rewriter reads. O(n) in the graph's ops.
"""
from __future__ import annotations

import base64
import dataclasses
from typing import Any

from fastt.ir import Graph, GraphMeta
from fastt.ir.ops import op_from_dict, op_to_dict
from fastt.passes.splitting import Split
from fastt.sched.strategy import Strategy

FORMAT = 1


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def graph_document(g: Graph) -> dict[str, Any]:
    ops = []
    for op in g:
        d = op_to_dict(op)
        d["node_def"] = _b64(op.node_def)
        ops.append(d)
    return {"name": g.name, "ops": ops, "library": _b64(g.meta.library),
            "collections": {k: list(v) for k, v in g.meta.collections.items()},
            "dropped_joins": {k: {**op_to_dict(op), "node_def": _b64(op.node_def)}
                              for k, op in g.meta.dropped_joins.items()}}


def _op(d: dict[str, Any]) -> Any:
    return op_from_dict(d).with_(node_def=_bytes(d.get("node_def")))


def graph_from_document(doc: dict[str, Any]) -> Graph:
    meta = GraphMeta(library=_bytes(doc.get("library")),
                     collections={k: list(v) for k, v in doc.get("collections", {}).items()},
                     dropped_joins={k: _op(d) for k, d in doc.get("dropped_joins", {}).items()})
    return Graph((_op(d) for d in doc["ops"]), name=doc.get("name", ""), meta=meta)


def to_document(s: Strategy) -> dict[str, Any]:
    """``s`` as JSON, its graph included."""
    return {"format": FORMAT, **s.to_dict(), "graph": graph_document(s.graph)}


def from_document(doc: dict[str, Any]) -> Strategy:
    """The strategy ``to_document`` wrote (``KeyError``/``ValueError`` when it is not one)."""
    if doc.get("format") != FORMAT:
        raise ValueError(f"strategy document format {doc.get('format')!r}, not {FORMAT}")
    splits = [Split(**d) for d in doc.get("split_details", [])]
    names = {f.name for f in dataclasses.fields(Strategy)}
    fields = {k: v for k, v in doc.items() if k in names and k not in ("graph", "splits")}
    return Strategy(**{**fields, "name": doc["strategy"], "graph": graph_from_document(
        doc["graph"]), "splits": splits})
