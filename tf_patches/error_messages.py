"""TensorFlow's error messages parsed in linear time.

When ``Session.run`` fails, TensorFlow looks for ``{{node NAME}}`` tags in the message
(``error_interpolation.parse_message``) with a pattern that starts with a lazy ``.*?``: on a
message without a tag it scans from every position to the end, so its time grows with the
square of the message's length. A gRPC worker that aborts a step as "The same RunGraph
request was received twice" quotes the whole request, the step's fed tensors included, byte
by byte (LeNet's images alone are 200 KB): such a message takes minutes of CPU to scan before
its error is raised (seconds already for 40 KB without a tag).

``install()`` replaces ``parse_message`` with one that finds the same tags by searching for
the tag alone (each search starts where the last tag ended), and returns what TensorFlow's
returns: the message with ``function_node`` tags taken out, the function tags, the node tags.
"""
from __future__ import annotations

import re
from typing import Any

from tensorflow.python.framework import error_interpolation as _interp

_original = _interp.parse_message
# None where TensorFlow's tag pattern moved: then its own parser stays
_TAG = re.compile(_interp._TAG_REGEX) if hasattr(_interp, "_TAG_REGEX") else None


def parse_message(message: str) -> tuple[str, list[Any], list[Any]]:
    """``message`` without its ``function_node`` tags, its function tags and its node tags,
    as ``error_interpolation.parse_message`` returns them; O(len(message))."""
    kept: list[str] = []
    func_tags: list[Any] = []
    node_tags: list[Any] = []
    pos = 0
    assert _TAG is not None
    for m in _TAG.finditer(message):
        tag = _interp._ParseTag(m.group("type"), m.group("name"))
        if tag.type == "function_node":
            kept.append(message[pos:m.start()])
            func_tags.append(tag)
        else:
            kept.append(message[pos:m.end()])
            node_tags.append(tag)
        pos = m.end()
    kept.append(message[pos:])
    return "".join(kept), func_tags, node_tags


def install() -> None:
    """TensorFlow's sessions parse error messages with ``parse_message`` (idempotent)."""
    if _TAG is not None and hasattr(_interp, "_ParseTag"):
        _interp.parse_message = parse_message


def uninstall() -> None:
    _interp.parse_message = _original
