"""The ops a fused kernel absorbed: what a trace does not show of a graph whose kernels
grappler or oneDNN fused (``Relu_1 = _MklNativeFusedConv2D``)."""
from __future__ import annotations

from fastt.ir import Graph


def absorbed_ops(graph: Graph, kernel_type: dict[str, str],
                  placement: dict[str, str]) -> dict[str, list[str]]:
    """Kernel op -> user ops fused into it.

    A node whose kernel type is not its user op's type (``Relu_1 = _MklNativeFusedConv2D``) may
    have absorbed producers that did not run on their own; an absent producer whose only
    consumers are the kernel, another absorbed op, or joins that did not run is taken to be
    part of it. A rewritten graph keeps the join of each replicated or split op under the
    original name, and TensorFlow prunes the joins that nothing reads: a replica of ``conv``
    feeds its own ``bias`` and the join ``conv``, which never ran.
    """
    result: dict[str, list[str]] = {}
    for user, ktype in kernel_type.items():
        typ = graph[user].type
        if not ktype or ktype == typ or ktype.endswith(("_" + typ, "Native" + typ)):
            continue  # the op's own kernel (possibly renamed, e.g. _MklNativeConv2D)
        members: list[str] = []
        frontier = [user]
        while frontier:
            cur = frontier.pop()
            for ref in graph[cur].inputs:
                p = ref.op
                if p in placement or p in members or graph[p].is_variable:
                    continue
                if all(e.dst == cur or (e.dst not in placement
                                        and graph[e.dst].meta.join is not None)
                       for e in graph.consumers(p)):
                    members.append(p)
                    frontier.append(p)
        if members:
            result[user] = members
    return result
