"""Analytical op costs calibrated against published measurements: a factor per op class.

TensorFlow's analytical estimator (``tf_patches.grappler_costs``) prices a GPU op from its
FLOPs and bytes at the device's peak rates. ``benchmarks/grounding.py`` compares the steps it
gives with published fp32 training throughputs on one V100 and fits one factor for the
convolutions and matrix products (``compute``) and one for the other ops (``memory``), by
non-negative least squares on the relative error; its leave-one-model-out scores are in the
benchmark report. The factors fitted on every published row are kept in
``calibration.json`` beside this module, by device kind; ``fastt plan --costs calibrated``
(the default) and the simulated testbed apply them.
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

from fastt.jsonio import interpreting, read_json

CLASSES = ("compute", "memory")
COMPUTE_TYPES = ("Conv2D", "Conv3D", "DepthwiseConv2d", "MatMul", "BatchMatMul")
PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calibration.json")


def op_class(op_type: str) -> str:
    """``compute`` for convolutions and matrix products (and their gradients), else
    ``memory``."""
    return "compute" if op_type.startswith(COMPUTE_TYPES) else "memory"


def scaled(ops: Iterable[Any], seconds: Mapping[str, float], factors: Mapping[str, float]
           ) -> dict[str, float]:
    """``seconds`` (op name -> seconds) times the factor of each op's class; ``ops``: the
    graph's ops (anything with ``name`` and ``type``). O(V)."""
    kinds = {op.name: op_class(op.type) for op in ops}
    return {n: t * factors[kinds.get(n, "memory")] for n, t in seconds.items()}


def factors(kind: str, path: str = PATH) -> dict[str, float] | None:
    """The fitted factors of device ``kind`` (e.g. ``V100``); None when none were fitted."""
    doc = read_json(path, "cost calibration", expect=dict)
    with interpreting(path, "cost calibration"):
        entry = doc.get("kinds", {}).get(kind)
        if entry is None:
            return None
        return {c: float(entry["factors"][c]) for c in CLASSES}
