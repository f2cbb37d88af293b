"""Ring all-reduce with mirrored variables: data parallelism as TensorFlow's
MirroredStrategy and Horovod run it, built from ordinary ops on the data-parallel graph.

``all_reduce(graph, n)`` takes ``data_parallel(graph, n)`` (replica k = the ops ``X/part{k}``,
each weight gradient summed by one ``AddN`` join) and returns a graph where:

- every replica k >= 1 keeps its own copy of each variable whose updates can be mirrored
  (``V/mirror{k}``; replica 0 keeps the user's) and applies the same summed gradient to it
  with its own copy of the update (``A/mirror{k}``), so no weight crosses a link; the reads
  its forward pass takes of the weights, and the ops between the summed gradients and the
  updates (weight decay, clipping by the global norm), are mirrored with them;
- the replicas' partial gradients are fused into buckets of about ``bucket_bytes``
  (flattened and concatenated, in the order the backward pass produces them, so the first
  buckets travel while it goes on), each bucket cut into n chunks; chunk c is summed along
  the ring from replica c+1 to replica c (reduce-scatter: n-1 sums), then passed along the
  ring to every replica (all-gather: n-1 copies), so each link carries 2(n-1)/n of the
  bucket's bytes (Patarasuk and Yuan, JPDC 2009; ``fastt.passes.ring``). The summed gradient
  keeps the join's name on replica 0 and is ``J/mirror{k}`` on replica k.

A variable is mirrored when every op of the step that writes it is a dense optimizer update
(``Apply*``) whose inputs, traced back to the summed gradients and the variables, hold no
other state, and that the replicas read; the others (a weight whose forward ops run once,
kept whole by ``fastt.passes.hybrid``; sparse updates; variables assigned in the step) keep one
copy, summed as in the PS layout. Values an update needs that are computed from the whole
batch (BatchNorm's statistics, which data parallelism computes once on the whole batch) are
read from where they are computed, as a learning rate is.
Writes outside the step (initializers, restores) reach the copies through ``sync_writes``.
O(V + E) to find what to mirror, plus the ops made: (n-1) per mirrored op and O(n^2) per
bucket.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable

from fastt.ir import Graph, Op, OpMeta, TensorRef, TensorSpec, writes_variable
from fastt.op_types import READS
from fastt.passes.replicas import replica_of
from fastt.passes.ring import MIRROR, mirror_name, ring_ops

BUCKET_BYTES = 25 * 2 ** 20  # PyTorch DDP's default bucket
SYNC = "/fastt_sync/"  # the ops after a write that copy its value into the copies


def mirrors(graph: Graph) -> dict[str, list[str]]:
    """User's variable -> its copies in ``graph`` (made by ``all_reduce``)."""
    out: dict[str, list[str]] = {}
    for op in graph:
        if op.is_variable and op.meta.origin is not None and op.meta.replica:
            out.setdefault(op.meta.origin, []).append(op.name)
    return out


def _dense_update(op: Op) -> bool:
    return writes_variable(op) and "Apply" in op.type and "Sparse" not in op.type


def _pure(op: Op) -> bool:
    """Computes the same value on every replica from the same inputs."""
    return not op.stateful or op.type in READS


def _forward(graph: Graph, sources: Iterable[str], through: Callable[[str], bool],
             control: bool = False) -> set[str]:
    """Ops reachable from ``sources`` over data edges (and control edges with ``control``),
    entering only ops ``through`` admits (the sources are included)."""
    seen = set(sources)
    stack = list(seen)
    while stack:
        x = stack.pop()
        after = graph.successors(x) if control else {e.dst for e in graph.consumers(x)}
        for y in after:
            if y not in seen and through(y):
                seen.add(y)
                stack.append(y)
    return seen


class _Analysis:
    """What ``all_reduce`` mirrors and which sums it reduces along the ring."""

    def __init__(self, graph: Graph, n: int) -> None:
        self.graph = g = graph
        self.joins = {op.name for op in g if op.type == "AddN" and op.meta.join is not None
                      and op.meta.join["kind"] == "sum" and len(op.inputs) == n}
        self.replicated = {op.name for op in g if replica_of(op) is not None}
        # ops that carry the batch beyond the sums of the replicas' gradients
        self.batchy = _forward(g, self.replicated, lambda x: x not in self.joins)
        writers: dict[str, list[str]] = {}
        for op in g:
            if writes_variable(op):
                for v in self._written(op):
                    writers.setdefault(v, []).append(op.name)
        self.writers = writers
        regions = {}
        for a in (op.name for op in g if _dense_update(op)):
            r = self._region(a)
            if r is not None:
                regions[a] = r
        mirrored = set(regions)
        while True:  # a variable is mirrored when all its writers are; fixpoint
            vars_ok = {v for v, ws in writers.items() if all(w in mirrored for w in ws)}
            keep = {a for a in mirrored if regions[a][1] <= vars_ok}
            if keep == mirrored:
                break
            mirrored = keep
        self.updates = mirrored
        self.variables = {v for a in mirrored for v in regions[a][1]}
        region: set[str] = set()
        for a in mirrored:
            region |= regions[a][0]
        self.reduced = {x for x in region if x in self.joins}
        # what the replicas' forward passes read of the mirrored variables
        reads = _forward(g, self.variables, lambda x: x not in self.replicated and
                         x not in self.batchy and x not in self.joins and _pure(g[x])
                         and not g[x].is_variable)
        wanted = {r.op for x in self.replicated for r in g[x].inputs if r.op in reads}
        self.mirror = (region - self.joins) | self._back(wanted, reads) | self.variables

    def _written(self, op: Op) -> list[str]:
        """The variables an update writes: those it takes by reference or handle (an
        optimizer's slots too)."""
        g = self.graph
        return [r.op for r in op.inputs if g[r.op].is_variable and (
            g.tensor(r).dtype.endswith("_ref") or g.tensor(r).dtype == "resource")]

    def _back(self, names: set[str], within: set[str]) -> set[str]:
        seen, stack = set(names), list(names)
        while stack:
            for r in self.graph[stack.pop()].inputs:
                if r.op in within and r.op not in seen:
                    seen.add(r.op)
                    stack.append(r.op)
        return seen

    def _region(self, update: str) -> tuple[set[str], set[str]] | None:
        """(the ops to mirror with ``update``, the variables it writes), or None when it
        cannot be mirrored: traced back over data edges, stopping at the summed gradients, at
        variables and at what carries the batch (never in a region: without this stop each
        update's trace crossed the whole forward pass); ops that no sum or written variable
        feeds (a learning rate) are read from where they are."""
        g = self.graph
        seen, stack, sources = {update}, [update], set()
        while stack:
            x = stack.pop()
            if x in self.joins:
                sources.add(x)
                continue
            if x in self.batchy and x != update:
                continue
            op = g[x]
            if op.is_variable:
                sources.add(x)
                continue
            for r in op.inputs:
                if r.op not in seen:
                    seen.add(r.op)
                    stack.append(r.op)
        variables = {x for x in sources if g[x].is_variable}
        # a variable only read (a learning rate, Adam's beta powers) stays shared
        written = {v for v in variables if update in self.writers.get(v, ())}
        read_only = variables - written
        # what comes from the whole batch (BatchNorm's statistics) is computed once, on
        # device 0, and read from there, like a learning rate
        region = _forward(g, (sources - read_only),
                          lambda x: x in seen and (x == update or x not in self.batchy)
                          ) & seen
        if any(not _pure(g[x]) for x in region if x != update and x not in sources):
            return None
        if not written or set(self._written(g[update])) != written:
            return None
        if not self._read_by_replicas(g[update].inputs[0].op):
            return None  # (a weight kept whole) a copy would cost its gradient on every link
        return region, written

    def _read_by_replicas(self, var: str) -> bool:
        """Whether a replica's op reads ``var`` (directly or through reads)."""
        stack, seen = [var], {var}
        while stack:
            for e in self.graph.consumers(stack.pop()):
                if e.dst in self.replicated:
                    return True
                if self.graph[e.dst].type in READS and e.dst not in seen:
                    seen.add(e.dst)
                    stack.append(e.dst)
        return False


def all_reduce(graph: Graph, n: int, bucket_bytes: float = BUCKET_BYTES,
               collective: bool = False) -> Graph:
    """The data-parallel ``graph`` of ``n`` replicas with ring all-reduce and mirrored
    variables (see the module docstring); ``graph`` itself when nothing can be mirrored.
    ``collective``: each bucket summed by NCCL (GPUs of one process), not by graph ops."""
    if n < 2:
        return graph
    a = _Analysis(graph, n)
    if not a.updates:
        return graph
    g = graph
    ops: dict[str, Op] = {}
    # Gradients gated per op (``gate_gradients``: the backward pass goes on once an op's
    # gradients are all computed) would make each replica wait for the summed ones, and a
    # bucket wait for itself: the replicas drop such gates (they order, they compute
    # nothing).
    after_sums = _forward(g, a.reduced, lambda x: x not in a.replicated and
                          not writes_variable(g[x]), control=True)
    ring = ring_ops(g, a.reduced, a.replicated, n, bucket_bytes, after_sums, collective)
    reduced = {op.name for op in ring if op.name in a.reduced}
    changed: dict[str, Op] = {}
    order = g.topological_order()

    def remap(refs: tuple[TensorRef, ...], k: int) -> tuple[TensorRef, ...]:
        return tuple(TensorRef(mirror_name(r.op, k), r.index)
                     if r.op in a.mirror or r.op in reduced else r for r in refs)

    per_replica = {op.meta.origin for op in g if op.type == "NoOp" and op.meta.replica is not None}

    def remap_names(names: tuple[str, ...], k: int) -> tuple[str, ...]:
        return tuple(mirror_name(c, k) if c in a.mirror or c in reduced else
                     f"{c}/part{k}" if c in per_replica else c for c in names)

    copies: list[Op] = []
    for name in order:
        op = g[name]
        if name in a.mirror:
            changed[name] = op.with_(meta=replace(op.meta, replica=0),
                                     control_inputs=remap_names(op.control_inputs, 0))
            for k in range(1, n):
                copies.append(op.with_(
                    name=mirror_name(name, k), inputs=remap(op.inputs, k),
                    control_inputs=remap_names(op.control_inputs, k),
                    colocate_with=remap_names(op.colocate_with, k),
                    meta=OpMeta(origin=name, replica=k)))
            continue
        rep = replica_of(op)
        if rep is not None:  # a replica's op reading mirrored weights reads its own copy
            gates = tuple(c for c in op.control_inputs if c not in after_sums)
            inputs, controls = remap(op.inputs, rep), remap_names(gates, rep)
            if inputs != op.inputs or controls != op.control_inputs:
                changed[name] = op.with_(inputs=inputs, control_inputs=controls)
            continue
        after = sorted(a.updates & {*op.control_inputs, *(r.op for r in op.inputs)})
        if after:  # what waits for an update waits for every copy of it: for replica k's
            # copies, through one NoOp there (one control edge across devices, not one each)
            waits = [Op(name=mirror_name(f"{name}/fastt_updates", k), type="NoOp",
                        control_inputs=tuple(mirror_name(u, k) for u in after),
                        meta=OpMeta(origin=name, fraction=0.0, replica=k))
                     for k in range(1, n)]
            copies += waits
            changed[name] = op.with_(control_inputs=op.control_inputs + tuple(
                w.name for w in waits))
    for name in order:
        if name in reduced:
            continue
        ops[name] = changed.get(name, g[name])
    for op in ring:
        ops[op.name] = op
    for op in copies:
        ops[op.name] = op
    out = Graph(ops.values(), name=g.name, meta=g.meta, like=g)
    # A gate every replica now waits for through its own copy waits for nothing the step
    # runs: kept aside (not scheduled), so that it can still be fetched by name.
    dead = out.unread(x for x in per_replica if x is not None)
    if not dead:
        return out
    return Graph((o for o in out if o.name not in dead), name=g.name, meta=replace(
        g.meta, dropped_joins={**g.meta.dropped_joins, **{x: out[x] for x in dead}}))


def _short(name: str) -> str:
    return name.replace("/", "_")


def sync_writes(graph: Graph) -> Graph:
    """``graph`` (a planned step merged with the user's other ops) where every write of a
    mirrored variable outside the mirrored updates (its initializer, a restore, an assign)
    is followed by copies of the written value into the variable's copies, run by whatever
    waits for that write (``global_variables_initializer``, a saver's ``restore_all``)."""
    copies = mirrors(graph)
    if not copies:
        return graph
    made: list[Op] = []
    follow: dict[str, list[str]] = {}  # write -> the ops copying its value
    for op in graph:
        if not writes_variable(op) or mirror_name(op.name, 1) in graph:
            continue
        for v in {r.op for r in op.inputs} & set(copies):
            var = graph[v]
            dtype = str(var.attrs.get("dtype", var.outputs[0].dtype)).removesuffix("_ref")
            resource = var.outputs[0].dtype == "resource"
            read = Op(name=f"{op.name}{SYNC}{_short(v)}", inputs=(TensorRef(v, 0),),
                      type="ReadVariableOp" if resource else "Identity",
                      outputs=(TensorSpec(dtype, var.outputs[0].shape if not resource
                                          else None),),
                      control_inputs=(op.name,), colocate_with=(v,), stateful=resource,
                      attrs={"dtype": dtype}, meta=OpMeta(origin=op.name, replica=0))
            made.append(read)
            for copy in copies[v]:
                k = graph[copy].meta.replica
                made.append(Op(name=f"{read.name}/mirror{k}",
                               type="AssignVariableOp" if resource else "Assign",
                               inputs=(TensorRef(copy, 0), TensorRef(read.name, 0)),
                               outputs=() if resource else (graph[copy].outputs[0],),
                               colocate_with=(copy,), stateful=True,
                               attrs={"dtype": dtype}, meta=OpMeta(origin=op.name, replica=k)))
                follow.setdefault(op.name, []).append(made[-1].name)
    ops = []
    for op in graph:
        extra = [s for c in op.control_inputs for s in follow.get(c, ())]
        ops.append(op.with_(control_inputs=op.control_inputs + tuple(extra)) if extra else op)
    return Graph(ops + made, name=graph.name, meta=graph.meta, like=graph)


def followers(names: Iterable[str]) -> dict[str, list[str]]:
    """Write -> the ops of ``names`` (a graph's) that copy its value into the variable's
    copies (``sync_writes``): a run of the write alone runs them too."""
    out: dict[str, list[str]] = {}
    for name in names:
        writer, sep, rest = name.partition(SYNC)
        if sep and MIRROR in rest:
            out.setdefault(writer, []).append(name)
    return out
