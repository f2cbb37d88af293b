"""The JSON Schemas of fastt's documents and a small validator for them.

The schemas are JSON Schema (draft 2020-12) files in this folder: ``strategy.schema.json``
(a dump's ``strategy.json``), ``trace.schema.json`` (``predicted_trace.json``,
``measured_trace.json``), ``cost_models.schema.json`` (``cost_models.json``) and
``declined.schema.json`` (the record of a session the plugin did not plan). ``errors`` checks
a document against one with the keywords those files use (``type``, ``enum``, ``const``,
``required``, ``properties``, ``additionalProperties``, ``items``, ``prefixItems``,
``minItems``, ``maxItems``, ``minimum``, local ``$ref``), so fastt needs no JSON Schema library.
``fastt.inspect.schema`` adds what only the layers above know (the strategy names).
"""
from __future__ import annotations

import functools
import json
import os
from typing import Any

from fastt.errors import FasttError

SCHEMA_DIR = os.path.dirname(os.path.abspath(__file__))
NAMES = ("strategy", "trace", "cost_models", "declined")
_TYPES: dict[str, Any] = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


class SchemaError(FasttError):
    """A schema that does not exist, or one this validator cannot read."""


@functools.lru_cache(maxsize=None)
def load(name: str) -> dict[str, Any]:
    """The schema file ``name`` (one of ``NAMES``), as written."""
    path = os.path.join(SCHEMA_DIR, f"{name}.schema.json")
    if name not in NAMES or not os.path.exists(path):
        raise SchemaError(f"no schema named {name!r} (known: {', '.join(NAMES)})")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def errors(doc: Any, root: dict[str, Any], limit: int = 20) -> list[str]:
    """What is wrong with ``doc`` under the schema ``root``: at most ``limit`` messages, each
    naming the place (``$.history[0].status``); empty when it is valid."""
    found: list[str] = []
    _check(doc, root, root, "$", found, limit)
    return found


def _check(v: Any, s: dict[str, Any], root: dict[str, Any], at: str, errors: list[str],
           limit: int) -> None:
    if len(errors) >= limit:
        return
    if "$ref" in s:
        ref = s["$ref"]
        if not ref.startswith("#/"):
            raise SchemaError(f"schema reference {ref!r} is not local")
        target: Any = root
        for part in ref[2:].split("/"):
            target = target[part]
        _check(v, target, root, at, errors, limit)
    if "const" in s and v != s["const"]:
        errors.append(f"{at}: {v!r} is not {s['const']!r}")
        return
    if "enum" in s and v not in s["enum"]:
        errors.append(f"{at}: {v!r} is not one of {s['enum']}")
        return
    if "type" in s:
        kinds = s["type"] if isinstance(s["type"], list) else [s["type"]]
        if not any(_TYPES[k](v) for k in kinds):
            errors.append(f"{at}: {type(v).__name__} {_clip(v)} is not of type "
                          f"{' or '.join(kinds)}")
            return
    if _TYPES["number"](v) and "minimum" in s and v < s["minimum"]:
        errors.append(f"{at}: {v!r} is below the minimum {s['minimum']}")
    if isinstance(v, dict):
        _check_object(v, s, root, at, errors, limit)
    elif isinstance(v, list):
        _check_array(v, s, root, at, errors, limit)


def _check_object(v: dict[str, Any], s: dict[str, Any], root: dict[str, Any], at: str,
                  errors: list[str], limit: int) -> None:
    for key in s.get("required", ()):
        if key not in v:
            errors.append(f"{at}: missing key {key!r}")
    props = s.get("properties", {})
    extra = s.get("additionalProperties", True)
    for key, value in v.items():
        if key in props:
            _check(value, props[key], root, f"{at}.{key}", errors, limit)
        elif extra is False:
            errors.append(f"{at}: unexpected key {key!r}")
        elif isinstance(extra, dict):
            _check(value, extra, root, f"{at}[{key!r}]", errors, limit)


def _check_array(v: list[Any], s: dict[str, Any], root: dict[str, Any], at: str,
                 errors: list[str], limit: int) -> None:
    if len(v) < s.get("minItems", 0):
        errors.append(f"{at}: {len(v)} items, fewer than {s['minItems']}")
    if "maxItems" in s and len(v) > s["maxItems"]:
        errors.append(f"{at}: {len(v)} items, more than {s['maxItems']}")
    prefix = s.get("prefixItems", [])
    for i, item in enumerate(v):
        sub = prefix[i] if i < len(prefix) else s.get("items")
        if isinstance(sub, dict):
            _check(item, sub, root, f"{at}[{i}]", errors, limit)


def _clip(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."
