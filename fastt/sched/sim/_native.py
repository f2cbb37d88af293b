"""The scheduling core's compiled parts (``_simcore``: ``_simcore.c`` with ``_simpeaks.c``,
``_simeft.c`` and ``_simedges.c``), built by ``pip install``; where they were not built, their
Python references run (``fastt.sched.sim.sim_loops``, ``simulate._flat_needs`` and
``_peak_memory``, ``dpos.rank_u`` and ``eft_list_schedule``, ``edges.graph_edges``),
giving the same results."""
from __future__ import annotations

import glob
import importlib.util
import os
import sys
from types import ModuleType

SIMCORE_ABI = 6  # the functions and arguments of _simcore: one built for others is not used


def _load() -> ModuleType | None:
    """``_simcore`` from this package or, when it runs from a checkout, from where
    ``pip install`` put it; None where it was not built (no C compiler at install) or was
    built from another version: the Python references then run."""
    try:
        from fastt.sched.sim import _simcore  # type: ignore[attr-defined]
        candidates: list[ModuleType] = [_simcore]
    except ImportError:
        candidates = []
    for d in sys.path:
        for path in sorted(glob.glob(os.path.join(d or os.curdir, "fastt", "sched", "sim",
                                                  "_simcore*.so"))):
            spec = importlib.util.spec_from_file_location("fastt.sched.sim._simcore", path)
            if spec and spec.loader:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                candidates.append(module)
    return next((m for m in candidates if getattr(m, "ABI", None) == SIMCORE_ABI), None)


simcore = _load()
