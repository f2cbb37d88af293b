"""TF-slim's parameter server as it runs: the variables and their updates on the host CPU.

TF-slim's ``model_deploy`` creates the variables on the host's CPU and applies the optimizer
there (an update is colocated with its variable); each clone reads the variables over PCIe,
and the clones' gradients are summed where TensorFlow's placer puts an op with no device,
the first GPU. ``data-parallel-ps`` keeps everything it shares on the first GPU instead;
``on_host`` moves a placement of that layout to TF-slim's.
"""
from __future__ import annotations

from fastt.ir import Graph
from fastt.op_types import VARIABLE_TYPES


def on_host(graph: Graph, placement: dict[str, str], host: str) -> dict[str, str]:
    """``placement`` of ``graph`` (a data-parallel graph) with every op of a variable's
    colocation group (the variable, its reads, its updates, its initializer: TensorFlow
    keeps them together) moved to the device ``host``. O(V)."""
    groups = graph.colocation_groups()
    with_variable = {groups[op.name] for op in graph
                     if op.is_variable or op.type in VARIABLE_TYPES}
    out = dict(placement)
    for op in graph:
        if groups[op.name] in with_variable and op.name in out:
            out[op.name] = host
    return out
