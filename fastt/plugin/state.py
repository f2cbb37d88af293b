"""Carry a training's state from one session to another, bit for bit.

The state is every variable (global, local, optimizer slots, the global step, metrics; written
into its mirrored copies too, where a strategy made them) and the position of every
``tf.data`` iterator (serialized by TensorFlow itself, shuffle buffers
and random state included). Values travel as numpy arrays, so they arrive unchanged. Reads
use the variable's own read op where the graph has one; what is missing is added under
``fastt_state/`` (to the user's graph too, even when finalized: reads only).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from fastt.op_types import CARRIED_VARIABLE_TYPES, ITERATOR_TYPES, PYTHON
from fastt.passes.allreduce import mirror_name
from tf_patches.session_hook import unfinalized

log = logging.getLogger("fastt")
SCOPE = "fastt_state"
#: Dataset ops whose state an iterator's serialization leaves out: Python (it cannot be
#: serialized at all) and stateful random draws (their streams would start anew).
UNSAVED_STATE = PYTHON | {
    "GeneratorDataset", "Multinomial", "RandomGamma", "RandomPoisson", "RandomPoissonV2",
    "RandomShuffle", "RandomStandardNormal", "RandomUniform", "RandomUniformInt",
    "TruncatedNormal"}
Run = Callable[[Any, Any], Any]  # run(fetches, feed_dict) on the right session
Value = np.ndarray | np.generic  # what Session.run returns for one tensor


@dataclass
class State:
    values: dict[str, Value] = field(default_factory=dict)
    iterators: dict[str, bytes] = field(default_factory=dict)
    uninitialized: list[str] = field(default_factory=list)


def stateful_ops(graph: tf.Graph) -> tuple[list[str], list[str]]:
    """(variable op names, iterator op names) of ``graph``, outside fastt's own ops."""
    variables, iterators = [], []
    for op in graph.get_operations():
        if op.name.startswith(SCOPE + "/"):
            continue
        if op.type in CARRIED_VARIABLE_TYPES:
            variables.append(op.name)
        elif op.type in ITERATOR_TYPES:
            iterators.append(op.name)
    return variables, iterators


def _existing_read(op: tf.Operation) -> tf.Tensor | None:
    if op.type != "VarHandleOp":
        return op.outputs[0]  # a reference variable's output reads as its value
    for c in op.outputs[0].consumers():
        if c.type == "ReadVariableOp" and not c.control_inputs:
            return c.outputs[0]
    return None


class StateOps:
    """Reads and writes of one graph's state, built on first use."""

    def __init__(self, graph: tf.Graph, variables: list[str], iterators: list[str]) -> None:
        self.graph = graph
        self.variables = [v for v in variables if has_op(graph, v)]
        self.iterators = [i for i in iterators if has_op(graph, i)]
        self._reads: dict[str, tf.Tensor] | None = None
        self._writes: tuple[dict[str, Any], dict[str, Any]] | None = None

    def reads(self) -> dict[str, tf.Tensor]:
        if self._reads is None:
            g, reads, missing = self.graph, {}, []
            for name in self.variables:
                t = _existing_read(g.get_operation_by_name(name))
                if t is None:
                    missing.append(name)
                else:
                    reads[name] = t
            if missing or self.iterators:
                with unfinalized(g), tf.name_scope(SCOPE + "/"):
                    for name in missing:
                        op = g.get_operation_by_name(name)
                        reads[name] = tf.raw_ops.ReadVariableOp(
                            resource=op.outputs[0], dtype=op.get_attr("dtype"))
                    for name in self.iterators:
                        h = g.get_operation_by_name(name).outputs[0]
                        reads[name] = tf.io.serialize_tensor(
                            tf.raw_ops.SerializeIterator(resource_handle=h))
            self._reads = reads
        return self._reads

    def capture(self, run: Run) -> State:
        """The state held by the session ``run`` runs on."""
        reads = self.reads()
        state = State()
        try:
            values = dict(zip(reads, run(list(reads.values()), None)))
        except tf.errors.FailedPreconditionError:  # some variable never initialized
            values = {}
            for name, t in reads.items():
                try:
                    values[name] = run(t, None)
                except tf.errors.FailedPreconditionError:
                    state.uninitialized.append(name)
        for name, v in values.items():
            if name in self.iterators:
                state.iterators[name] = v
            else:
                state.values[name] = np.asarray(v)
        if state.uninitialized:
            log.debug("fastt: not carried (never initialized): %s", state.uninitialized)
        return state

    def _build_writes(self) -> tuple[dict[str, Any], dict[str, Any]]:
        if self._writes is None:
            g = self.graph
            feeds, ops = {}, {}
            with unfinalized(g), tf.name_scope(SCOPE + "/"):
                for name in self.variables:
                    op = g.get_operation_by_name(name)
                    ph = tf.compat.v1.placeholder(op.get_attr("dtype"), name="value")
                    feeds[name] = ph
                    writes = [_assign(g.get_operation_by_name(n), ph)
                              for n in [name] + _copies(g, name)]
                    ops[name] = writes[0] if len(writes) == 1 else tf.group(*writes)
                for name in self.iterators:
                    ph = tf.compat.v1.placeholder(tf.string, [], name="iterator")
                    feeds[name] = ph
                    ops[name] = tf.raw_ops.DeserializeIterator(
                        resource_handle=g.get_operation_by_name(name).outputs[0],
                        serialized=tf.io.parse_tensor(ph, tf.variant))
            self._writes = (feeds, ops)
        return self._writes

    def restore(self, run: Run, state: State,
                inits: dict[str, tuple[str, dict[str, Any]]] | None = None) -> None:
        """Put ``state`` into the session ``run`` runs on: variables first, then iterators,
        each after the initializer it last ran (``inits``, see ``IteratorInits``)."""
        feeds, ops = self._build_writes()
        for name in state.iterators:
            if inits and name in inits and name in ops:
                run(inits[name][0], inits[name][1])
        for group in (state.values, state.iterators):
            names = [n for n in group if n in ops]
            if names:
                run([ops[n] for n in names], {feeds[n]: group[n] for n in names})


def unserializable(state: StateOps, run: Run) -> set[str]:
    """The iterators of ``state`` whose position TensorFlow cannot serialize whole: over
    Python or stateful random draws (``unsaved``), or failing to serialize in the session
    ``run`` runs on (one not initialized yet is not counted)."""
    out = unsaved(state.graph)[0] & set(state.iterators)
    reads = state.reads()
    for name in sorted(set(state.iterators) - out):
        try:
            run(reads[name], None)
        except tf.errors.FailedPreconditionError:
            pass
        except tf.errors.OpError as e:
            log.debug("fastt: iterator %s stays in the script's session (%s)", name,
                      str(e).splitlines()[0] if str(e) else type(e).__name__)
            out.add(name)
    return out


def unsaved(graph: tf.Graph) -> tuple[set[str], set[str]]:
    """The iterators (op names) of ``graph`` whose dataset holds state that
    ``SerializeIterator`` does not save (``UNSAVED_STATE``: Python, stateful random draws),
    in its ops or in the functions they call at any depth; and the functions their datasets
    call."""
    lib = {f.signature.name: f for f in graph.as_graph_def().library.function}
    memo: dict[str, bool] = {}

    def calls(attrs: Any) -> list[str]:
        names = []
        for v in attrs.values():
            if v.HasField("func"):
                names.append(v.func.name)
            names.extend(f.name for f in v.list.func)
        return names

    def holds(fn: str) -> bool:
        if fn not in memo:
            memo[fn] = False  # a recursive call adds nothing
            f = lib.get(fn)
            memo[fn] = f is not None and any(
                n.op in UNSAVED_STATE or any(holds(c) for c in calls(n.attr))
                for n in f.node_def)
        return memo[fn]

    def reached(fns: list[str]) -> set[str]:
        seen, stack = set(), list(fns)
        while stack:
            fn = stack.pop()
            if fn in lib and fn not in seen:
                seen.add(fn)
                stack.extend(c for n in lib[fn].node_def for c in calls(n.attr))
        return seen

    iterators: set[str] = set()
    functions: set[str] = set()
    for op in graph.get_operations():
        if op.type == "MakeIterator":
            dataset = [graph.get_operation_by_name(n)
                       for n in executed(graph, [op.inputs[0].name], [], set())]
            iterator = op.inputs[-1].op.name
        elif op.type == "OneShotIterator":
            dataset, iterator = [op], op.name
        else:
            continue
        fns = [c for d in dataset for c in calls(d.node_def.attr)]
        if any(d.type in UNSAVED_STATE for d in dataset) or any(holds(c) for c in fns):
            iterators.add(iterator)
            functions |= reached(fns)
    return iterators, functions


def _copies(graph: tf.Graph, name: str) -> list[str]:
    """The mirrored copies of variable ``name`` in ``graph`` (``V/mirror1``, ...)."""
    out: list[str] = []
    while has_op(graph, mirror_name(name, len(out) + 1)):
        out.append(mirror_name(name, len(out) + 1))
    return out


def _assign(op: tf.Operation, value: Any) -> tf.Operation:
    if op.type == "VarHandleOp":
        return tf.raw_ops.AssignVariableOp(resource=op.outputs[0], value=value)
    return tf.raw_ops.Assign(ref=op.outputs[0], value=value, validate_shape=False).op


def executed(graph: tf.Graph, fetches: list[str], targets: list[str], fed: set[str]
             ) -> set[str]:
    """The names of the ops a run executes: the fan-in of its fetches (tensor names) and
    targets (op names), cut at the tensors it feeds."""
    stack = [graph.get_operation_by_name(t) for t in targets]
    stack += [graph.get_tensor_by_name(f).op for f in fetches if f not in fed]
    seen = {op.name for op in stack}
    while stack:
        op = stack.pop()
        for p in [t.op for t in op.inputs if t.name not in fed] + list(op.control_inputs):
            if p.name not in seen:
                seen.add(p.name)
                stack.append(p)
    return seen


class RunFanIn:
    """``executed`` of each run signature of ``graph``, computed once per signature and graph
    version and shared by everything that asks what a run executes."""

    def __init__(self, graph: tf.Graph) -> None:
        self.graph = graph
        self._version = -1
        self._cache: dict[Any, set[str]] = {}

    def __call__(self, fetches: list[str], targets: list[str], feeds: Any) -> set[str]:
        if self._version != self.graph.version:
            self._version, self._cache = self.graph.version, {}
        key = (tuple(fetches), tuple(targets), tuple(sorted(feeds)))
        ran = self._cache.get(key)
        if ran is None:
            ran = self._cache[key] = executed(self.graph, fetches, targets, set(feeds))
        return ran


class IteratorInits:
    """The initializer (``MakeIterator``) each initializable iterator last ran, with its
    feeds: a new session runs it before restoring the iterator's position, as TensorFlow
    restores a position only into an iterator made from the same dataset."""

    def __init__(self, graph: tf.Graph, fan_in: RunFanIn) -> None:
        self.graph, self.fan_in = graph, fan_in
        self.last: dict[str, tuple[str, dict[str, Any]]] = {}
        self._inits: dict[Any, list[tf.Operation]] = {}
        self._version = -1

    def see(self, fetches: list[str], targets: list[str], feeds: dict[str, Any]) -> None:
        """Note a run (before it runs: an initializer that then fails leaves no position)."""
        if self._version != self.graph.version:
            self._version, self._inits = self.graph.version, {}
        key = (tuple(fetches), tuple(targets), tuple(sorted(feeds)))
        inits = self._inits.get(key)
        if inits is None:
            ran = self.fan_in(fetches, targets, feeds)
            inits = self._inits[key] = [self.graph.get_operation_by_name(n) for n in ran
                                        if self.graph.get_operation_by_name(n).type
                                        == "MakeIterator"]
        for op in inits:
            needed = executed(self.graph, [], [op.name], set())
            self.last[op.inputs[1].op.name] = (op.name, {n: v for n, v in feeds.items()
                                                         if n.split(":")[0] in needed})


def has_op(graph: tf.Graph, name: str) -> bool:
    try:
        graph.get_operation_by_name(name)
        return True
    except KeyError:
        return False
