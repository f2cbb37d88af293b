"""Per-replica copies of what data-parallel replicas share: the gates (``NoOp``s) they wait
for, the constants they read, and one gate for each set of shared ops they wait for. Passes
over the IR made by ``fastt.passes.data_parallel``; each returns a new graph, O(ops + edges).
"""
from __future__ import annotations

from fastt.ir import Graph, Op, OpMeta, TensorRef
from fastt.passes import sync_batch_norm


def replica_of(op: Op) -> int | None:
    """Replica index of a sub-op made by ``data_parallel`` or ``all_reduce`` (None for
    shared ops)."""
    if op.meta.replica is not None:
        return op.meta.replica
    if op.meta.origin is None:
        return None
    tail = op.name.rsplit("/part", 1)
    return int(tail[1]) if len(tail) == 2 and tail[1].isdigit() else None


def gates_per_replica(graph: Graph, n: int) -> Graph:
    """Each ``NoOp`` that waits for replicas' ops (``tf.gradients``' per-op gates,
    ``tf.group``) gets a copy per replica waiting for that replica's ops (and the shared
    ones); a replica's op waits for its replica's copy, everything else for all of them. A
    gate orders, it computes nothing: without this every replica waited for the slowest at
    each gate, through a control edge to the first device and back (198 of them a step on a
    small Inception)."""
    made: list[Op] = []
    gates: set[str] = set()
    for op in graph:
        if op.type != "NoOp" or op.inputs or replica_of(op) is not None:
            continue
        per: list[list[str]] = [[] for _ in range(n)]
        shared = []
        for c in op.control_inputs:
            k = replica_of(graph[c])
            if k is None:
                shared.append(c)
            elif k < n:
                per[k].append(c)
        if not all(per):
            continue
        gates.add(op.name)
        made += [op.with_(name=f"{op.name}/part{k}", control_inputs=tuple(per[k] + shared),
                          meta=OpMeta(origin=op.name, fraction=0.0, replica=k))
                 for k in range(n)]
    if not gates:
        return graph
    ops = []
    waits: dict[tuple[str, ...], bool] = {}  # control inputs (often shared) -> a gate among them
    for op in graph:
        if op.name in gates:
            op = op.with_(control_inputs=tuple(f"{op.name}/part{k}" for k in range(n)))
        k = replica_of(op)
        controls = op.control_inputs
        if k is not None and controls:
            if controls not in waits:
                waits[controls] = any(c in gates for c in controls)
            if waits[controls]:
                op = op.with_(control_inputs=tuple(f"{c}/part{k}" if c in gates else c
                                                   for c in controls))
        ops.append(op)
    return Graph(ops + made, name=graph.name, meta=graph.meta, like=graph)


def constants_per_replica(graph: Graph) -> Graph:
    """Each replica gets its own copy of the constants it reads (``Const``s, also through
    the ``IdentityN`` of a folded ``ShapeN``), control inputs and all: shared, one would
    cross a link to every replica at every step (a convolution's gradient reads its filter's
    shape: 200 such messages queued at the start of ResNet-200's backward pass on each
    link)."""
    sources: dict[TensorRef, TensorRef] = {}  # each tensor read once: 16 replicas read alike

    def source(ref: TensorRef) -> TensorRef:
        """The tensor ``ref`` aliases, through folded shape ops."""
        s = sources.get(ref)
        if s is None:
            op = graph[ref.op]
            s = sources[ref] = source(op.inputs[ref.index if op.type == "IdentityN" else 0]) \
                if op.meta.folded and op.type in ("IdentityN", "Identity") else ref
        return s

    def constant(ref: TensorRef) -> bool:
        op = graph[ref.op]
        return op.type == "Const" and replica_of(op) is None

    wanted: dict[str, set[int]] = {}  # constant -> the replicas reading it
    constants: dict[str, bool] = {}
    for op in graph:
        k = replica_of(op)
        if k is None:
            continue
        for r in op.inputs:
            s = source(r)
            is_constant = constants.get(s.op)
            if is_constant is None:
                is_constant = constants[s.op] = constant(s)
            if is_constant:
                wanted.setdefault(s.op, set()).add(k)
    if not wanted:
        return graph

    def own(ref: TensorRef, k: int) -> TensorRef:
        s = source(ref)
        return TensorRef(f"{s.op}/part{k}", s.index) if s.op in wanted else ref

    made = [sync_batch_norm.replica_copy(graph[name], f"{name}/part{k}", k)
            for name, ks in wanted.items() for k in sorted(ks)]
    ops = []
    for op in graph:
        k = replica_of(op)
        if k is not None:
            inputs = tuple(own(r, k) for r in op.inputs)
            if inputs != op.inputs:
                op = op.with_(inputs=inputs)
        ops.append(op)
    return Graph(ops + made, name=graph.name, meta=graph.meta, like=graph)


def shared_control_gates(graph: Graph) -> Graph:
    """Replicas' ops that wait for the same several shared ops (and perhaps ops of their
    own replica) wait for one gate (a ``NoOp`` waiting for those shared ops) instead: one
    message to each replica's device rather than one per shared op. The order is the
    same. (``with tf.control_dependencies(update_ops): minimize(loss)``, as the batch-norm
    documentation says, makes every gradient op built without an input from the context
    wait for every moving-average update: on ResNet-200, 400 messages on each link from
    the first device.)"""
    gates: dict[tuple[str, ...], str] = {}
    # per list of control inputs (ops share them: tf.gradients gives each gradient op the
    # same ~400 updates on ResNet-200), its new list, or None when it keeps its own
    rewired: dict[tuple[str, ...], tuple[str, ...] | None] = {}
    is_shared: dict[str, bool] = {}  # op -> shared by the replicas (asked of each once)
    ops = []
    for op in graph:
        if len(op.control_inputs) < 2 or replica_of(op) is None:
            ops.append(op)
            continue
        controls = op.control_inputs
        if controls not in rewired:
            for c in controls:
                if c not in is_shared:
                    is_shared[c] = replica_of(graph[c]) is None
            shared = tuple(sorted(c for c in controls if is_shared[c]))
            if len(shared) > 1:
                if shared not in gates:
                    gates[shared] = f"fastt_control_gate{len(gates)}"
                own = tuple(c for c in controls if not is_shared[c])
                rewired[controls] = own + (gates[shared],)
            else:
                rewired[controls] = None
        new = rewired[controls]
        ops.append(op if new is None else op.with_(control_inputs=new))
    if not gates:
        return graph
    made = [Op(name=name, type="NoOp", control_inputs=deps, device=graph[deps[0]].device)
            for deps, name in gates.items()]
    return Graph(ops + made, name=graph.name, meta=graph.meta, like=graph)
