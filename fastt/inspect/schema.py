"""The documented schemas of a strategy dump (``fastt/schemas/``), checked.

``validate`` checks a document against one of them, the strategy schema's strategy names
filled in from the registry as it is now; ``check`` raises ``DumpError`` naming the file.
"""
from __future__ import annotations

import copy
import functools
from typing import Any

from fastt import schemas
from fastt.errors import FasttError

#: dump file -> schema name
FILES = {"strategy.json": "strategy", "predicted_trace.json": "trace",
         "measured_trace.json": "trace", "cost_models.json": "cost_models"}


class DumpError(FasttError):
    """A strategy dump (or one of its files) is missing or not what its schema says."""


def schema(name: str) -> dict[str, Any]:
    """The schema ``name`` (``strategy``, ``trace``, ``cost_models`` or ``declined``); the
    strategy schema's strategy names are the registry's as it is now, and the name of a step
    fitted into a memory limit (``memory_fit.FITTED``)."""
    if name == "strategy":
        from fastt.sched.registry import names
        from fastt.sched.search.memory_fit import FITTED
        return _strategy(names() + (FITTED,))
    return schemas.load(name)


@functools.lru_cache(maxsize=4)
def _strategy(names: tuple[str, ...]) -> dict[str, Any]:
    """The strategy schema with ``names`` as its strategy names (built once per registry)."""
    doc = copy.deepcopy(schemas.load("strategy"))
    doc["$defs"]["strategy_name"]["enum"] = list(names)
    return doc


def validate(doc: Any, name: str, limit: int = 20) -> list[str]:
    """What is wrong with ``doc`` under schema ``name``: at most ``limit`` messages, each
    naming the place (``$.history[0].status``); empty when it is valid."""
    return schemas.errors(doc, schema(name), limit)


def check(doc: Any, name: str, what: str) -> None:
    """Raise ``DumpError`` naming ``what`` (e.g. a file) when ``doc`` is not valid."""
    found = validate(doc, name)
    if found:
        raise DumpError(f"{what} does not follow the {name} schema: " + "; ".join(found[:5]))
