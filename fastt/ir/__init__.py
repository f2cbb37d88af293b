"""The op-graph intermediate representation every fastt pass reads and returns.

A ``Graph`` is an ordered set of ``Op``; an op names its data inputs as ``TensorRef`` (producer
op, output index) and its control inputs by op name, and describes each output with a
``TensorSpec`` (dtype, static shape, bytes). Nothing here imports TensorFlow: adapters in
``fastt.adapters`` build graphs from ``tf.Graph``/``GraphDef`` and write them back.

Graphs are treated as values: passes build a new ``Graph`` instead of editing one in place.
"""
from __future__ import annotations

from typing import Any, Collection, Iterable, Iterator

import networkx as nx

from fastt import dtypes
from fastt.errors import GraphStructureError
from fastt.ir.ops import (Edge, GraphMeta, Op, OpMeta, Shape, TensorRef, TensorSpec,
                          op_from_dict, op_to_dict, tensor_spec, writes_variable)
from fastt.op_types import BACK_EDGE_TYPES, LOOP_TYPES

__all__ = ["Edge", "Graph", "GraphMeta", "Op", "OpMeta", "Shape", "TensorRef", "TensorSpec",
           "tensor_spec", "writes_variable"]


class Graph:
    """An ordered, validated set of ops. Build a new one to change it."""

    def __init__(self, ops: Iterable[Op], name: str = "",
                 meta: GraphMeta | None = None, like: "Graph | None" = None) -> None:
        """``like``: a graph these ops were derived from (a pass's input), whose ops that
        are here unchanged need no check again when no op they could read is gone or has
        fewer outputs."""
        self.name = name
        self.meta = meta or GraphMeta()
        self._ops: dict[str, Op] = {}
        for op in ops:
            if op.name in self._ops:
                raise GraphStructureError(f"duplicate op name {op.name!r}")
            self._ops[op.name] = op
        self._validate(self._unchecked(like) if like is not None else self._ops.values())
        self._consumers: dict[str, list[Edge]] | None = None
        self._control_succ: dict[str, list[str]] | None = None
        self._topo: list[str] | None = None
        self._frames: dict[str, list[str]] | None = None

    def _unchecked(self, like: "Graph") -> Iterable[Op]:
        """The ops to check when the graph derives from ``like``: all when an op of ``like``
        is gone or has fewer outputs here, else those that are not ``like``'s own."""
        base = like._ops
        fresh = [op for op in self._ops.values() if base.get(op.name) is not op]
        if base.keys() - self._ops.keys() or any(
                len(op.outputs) < len(base[op.name].outputs) for op in fresh
                if op.name in base):
            return self._ops.values()
        return fresh

    def _validate(self, ops: Iterable[Op]) -> None:
        known = self._ops
        get = known.get
        for op in ops:  # a hot loop of every pass: the message is worked out on a misfit
            for ref in op.inputs:
                src = get(ref.op)
                if src is None or not 0 <= ref.index < len(src.outputs):
                    self._misfit(op)
            for c in op.control_inputs:
                if c not in known:
                    self._misfit(op)

    def _misfit(self, op: Op) -> None:
        """Raise what is wrong with the inputs of ``op``."""
        for i, ref in enumerate(op.inputs):
            src = self._ops.get(ref.op)
            if src is None:
                raise GraphStructureError(
                    f"op {op.name!r} input {i} refers to missing op {ref.op!r}")
            if not 0 <= ref.index < len(src.outputs):
                raise GraphStructureError(
                    f"op {op.name!r} input {i} refers to output {ref.index} of "
                    f"{ref.op!r}, which has {len(src.outputs)} outputs")
        for c in op.control_inputs:
            if c not in self._ops:
                raise GraphStructureError(
                    f"op {op.name!r} has a control input from missing op {c!r}")

    # --- access -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self._ops.values())

    def __contains__(self, name: object) -> bool:
        return name in self._ops

    def __getitem__(self, name: str) -> Op:
        try:
            return self._ops[name]
        except KeyError:
            raise KeyError(f"no op named {name!r} in graph") from None

    @property
    def names(self) -> list[str]:
        return list(self._ops)

    def tensor(self, ref: TensorRef) -> TensorSpec:
        return self._ops[ref.op].outputs[ref.index]

    def data_edges(self) -> list[Edge]:
        return [Edge(ref.op, ref.index, op.name, i)
                for op in self._ops.values() for i, ref in enumerate(op.inputs)]

    def control_edges(self) -> list[tuple[str, str]]:
        return [(c, op.name) for op in self._ops.values() for c in op.control_inputs]

    def consumers(self, name: str) -> list[Edge]:
        """Data edges leaving op ``name``."""
        if self._consumers is None:
            index: dict[str, list[Edge]] = {n: [] for n in self._ops}
            for e in self.data_edges():
                index[e.src].append(e)
            self._consumers = index
        return self._consumers[name]

    def control_successors(self, name: str) -> list[str]:
        if self._control_succ is None:
            index: dict[str, list[str]] = {n: [] for n in self._ops}
            for src, dst in self.control_edges():
                index[src].append(dst)
            self._control_succ = index
        return self._control_succ[name]

    def unread(self, names: Iterable[str]) -> set[str]:
        """Those of ``names`` that no op reads, by data or control edge: one scan of the
        references, unless the edge indexes are built already (building them costs several
        times more, for a graph often replaced right after)."""
        wanted = {n for n in names if n in self._ops}
        if self._consumers is not None and self._control_succ is not None:
            return {n for n in wanted if not self._consumers[n] and not self._control_succ[n]}
        ops = self._ops.values()
        read = {c for op in ops for c in op.control_inputs if c in wanted}
        read.update(r.op for op in ops for r in op.inputs if r.op in wanted)
        return wanted - read

    def predecessors(self, name: str) -> set[str]:
        op = self._ops[name]
        return {ref.op for ref in op.inputs} | set(op.control_inputs)

    def successors(self, name: str) -> set[str]:
        return {e.dst for e in self.consumers(name)} | set(self.control_successors(name))

    # --- structure ----------------------------------------------------------------------
    def is_back_edge_source(self, name: str) -> bool:
        """True for NextIteration ops, whose output edge closes a while loop."""
        return self._ops[name].type in BACK_EDGE_TYPES

    def topological_order(self) -> list[str]:
        """Op names, producers first, generation by generation (networkx's
        ``topological_generations``: Kahn's algorithm, first in first out). Loop back edges
        (out of NextIteration) are ignored.

        Raises GraphStructureError naming ops on a cycle that no while loop explains.
        """
        if self._topo is None:
            order = self._generations()
            if len(order) < len(self._ops):
                cycle = sorted({a for a, _ in nx.find_cycle(self.dag())})[:5]
                raise GraphStructureError(
                    f"graph has a cycle outside any while loop, through {cycle}")
            self._topo = order
        return list(self._topo)

    def _generations(self) -> list[str]:
        """``topological_generations`` of ``dag()`` flattened, in the same order, without
        building the networkx graph (every compile needs it; this takes a quarter of the
        time); short of some ops when there is a cycle. O(V + E), over op numbers."""
        ops = self._ops
        names = list(ops)
        index = {n: i for i, n in enumerate(names)}
        back = {index[n] for n, op in ops.items() if op.type in BACK_EDGE_TYPES}
        # each op's successors: its data consumers first, then its control successors
        succ: list[list[int]] = [[] for _ in names]
        data: list[Collection[int]] = []  # per op, the producers it reads (an edge counts once)
        none: tuple[int, ...] = ()
        for j, op in enumerate(ops.values()):
            ins = op.inputs
            preds: Collection[int]
            if len(ins) > 1:
                preds = {index[r.op] for r in ins} - back
            elif ins:
                i = index[ins[0].op]
                preds = none if i in back else (i,)
            else:
                preds = none
            data.append(preds)
            for i in preds:
                succ[i].append(j)
        indegree = [len(d) for d in data]
        for j, op in enumerate(ops.values()):
            if op.control_inputs:
                for i in dict.fromkeys(index[c] for c in op.control_inputs):
                    if i not in back and i not in data[j]:
                        succ[i].append(j)
                        indegree[j] += 1
        generation = [j for j, d in enumerate(indegree) if d == 0]
        order: list[int] = []
        while generation:
            order += generation
            following = []
            for i in generation:
                for j in succ[i]:
                    indegree[j] -= 1
                    if indegree[j] == 0:
                        following.append(j)
            generation = following
        return [names[i] for i in order]

    def dag(self) -> "nx.DiGraph[str]":
        """The graph as a networkx DAG over op names, loop back edges left out; each op's
        successors are its data consumers, then its control successors, in graph order."""
        dag: nx.DiGraph[str] = nx.DiGraph()
        dag.add_nodes_from(self._ops)
        back = {n for n in self._ops if self.is_back_edge_source(n)}
        ops = self._ops.values()
        dag.add_edges_from((r.op, op.name) for op in ops for r in op.inputs if r.op not in back)
        dag.add_edges_from((c, op.name) for op in ops for c in op.control_inputs
                           if c not in back)
        return dag

    def _dag_preds(self, op: Op) -> list[str]:
        preds = [ref.op for ref in op.inputs] + list(op.control_inputs)
        return [p for p in preds if not self.is_back_edge_source(p)]

    def colocation_groups(self) -> dict[str, str]:
        """Op name -> representative of its colocation group (hard constraints).

        Groups join ops named in ``_class: loc:@...`` attributes and the two ends of every
        edge that carries a reference or a resource handle (TensorFlow places those together).
        """
        parent: dict[str, str] = {}  # a union-find forest of the ops in some union

        def find(x: str) -> str:
            up = parent.get(x, x)
            while up != x:  # path halving
                above = parent.get(up, up)
                parent[x] = above
                x, up = up, above
            return x

        def union(a: str, b: str) -> None:
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[ra] = rb
                parent.setdefault(rb, rb)

        handles: dict[str, bool] = {}  # dtype -> carries a reference or a resource
        ops = self._ops
        for op in ops.values():
            for other in op.colocate_with:
                if other in ops:
                    union(op.name, other)
            for ref in op.inputs:
                dtype = ops[ref.op].outputs[ref.index].dtype
                handle = handles.get(dtype)
                if handle is None:
                    handle = handles[dtype] = dtypes.is_ref_or_resource(dtype)
                if handle:
                    union(op.name, ref.op)
        members: dict[str, list[str]] = {}
        for x in parent:
            members.setdefault(find(x), []).append(x)
        # each group represented by its least name, whatever order the unions came in
        out = {n: n for n in ops}
        for group in members.values():
            out.update(dict.fromkeys(group, min(group)))
        return out

    def while_frames(self) -> dict[str, list[str]]:
        """Innermost while-loop frame name -> ops inside it (empty when the graph has no loop);
        found once per graph (each caller gets lists of its own)."""
        if self._frames is None:
            self._frames = self._while_frames()
        return {frame: list(ops) for frame, ops in self._frames.items()}

    def _while_frames(self) -> dict[str, list[str]]:
        if not any(op.type in LOOP_TYPES for op in self._ops.values()):
            return {}
        stack: dict[str, tuple[str, ...]] = {}
        for n in self.topological_order():
            op = self._ops[n]
            preds = [p for p in self._dag_preds(op)]
            outer = max((stack[p] for p in preds), key=len, default=())
            if op.type in ("Enter", "RefEnter"):
                frame = str(op.attrs.get("frame_name", f"frame_of_{n}"))
                src = stack.get(op.inputs[0].op, ()) if op.inputs else ()
                stack[n] = src + (frame,)
            elif op.type in ("Exit", "RefExit"):
                stack[n] = outer[:-1]
            else:
                stack[n] = outer
        frames: dict[str, list[str]] = {}
        for n, s in stack.items():
            if s and self._ops[n].type not in ("Exit", "RefExit"):
                frames.setdefault(s[-1], []).append(n)
        return frames

    # --- building new graphs ------------------------------------------------------------
    def replace_ops(self, changed: dict[str, Op]) -> "Graph":
        """A new graph where the ops named in ``changed`` are swapped for the given ones."""
        missing = set(changed) - set(self._ops)
        if missing:
            raise KeyError(f"replace_ops: no such ops {sorted(missing)[:5]}")
        return Graph((changed.get(n, op) for n, op in self._ops.items()), name=self.name,
                     meta=self.meta, like=self)

    def with_output_shapes(self, shapes: dict[TensorRef, tuple[int, ...]],
                           nbytes: dict[TensorRef, int] | None = None) -> "Graph":
        """A new graph whose unknown output shapes (and bytes) are filled from measurements.

        Known static dimensions are kept; a measured shape of another rank is ignored.
        """
        nbytes = nbytes or {}
        changed: dict[str, Op] = {}
        for ref in set(shapes) | set(nbytes):
            op = changed.get(ref.op) or self._ops.get(ref.op)
            if op is None or ref.index >= len(op.outputs):
                continue
            old = op.outputs[ref.index]
            if old.fully_defined and old.nbytes is not None:
                continue
            shape = old.shape
            seen = shapes.get(ref)
            if seen is not None and (shape is None or len(shape) == len(seen)):
                shape = tuple(s if s is not None else d for s, d in
                              zip(shape or (None,) * len(seen), seen))
            spec = TensorSpec(old.dtype, shape)
            if spec.nbytes is None and ref in nbytes:
                spec = TensorSpec(old.dtype, shape, int(nbytes[ref]))
            outs = list(op.outputs)
            outs[ref.index] = spec
            changed[ref.op] = op.with_(outputs=tuple(outs))
        return self.replace_ops(changed) if changed else self

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description (without ``meta``)."""
        return {"name": self.name, "ops": [op_to_dict(op) for op in self._ops.values()]}

    def fan_in(self, names: Iterable[str]) -> "Graph":
        """The subgraph of ``names`` and everything they depend on (data and control): what a
        ``Session.run`` of them executes."""
        keep: set[str] = set()
        stack = [n.split(":")[0].lstrip("^") for n in names]
        missing = [n for n in stack if n not in self._ops]
        if missing:
            raise KeyError(f"no op named {missing[0]!r} in graph")
        while stack:
            n = stack.pop()
            if n in keep:
                continue
            keep.add(n)
            op = self._ops[n]
            stack.extend(r.op for r in op.inputs)
            stack.extend(op.control_inputs)
        return Graph((op for n, op in self._ops.items() if n in keep), name=self.name,
                     meta=self.meta)

    def loop_summary(self) -> dict[str, Any]:
        """What loops the graph has: v1 while frames and functional While ops."""
        functional = [op.name for op in self._ops.values()
                      if op.type in ("While", "StatelessWhile")]
        frames = self.while_frames()
        return {"while_frames": {k: len(v) for k, v in frames.items()},
                "functional_loops": functional}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Graph":
        return cls((op_from_dict(d) for d in data["ops"]), name=data.get("name", ""))
