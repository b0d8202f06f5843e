"""JSON nested deeper than orjson writes.

orjson reads values nested up to 1024 levels but writes none deeper than 255 (a
TypeError, "Recursion limit reached"), and Python's own recursion (`repr`, `json`) stops
near 1000. A body the parser accepted may hold such a value (issue 36, finding 4):
`sorted_json` writes any of them without recursion, for what must not fail on one
(counting it, the stand-ins' digests), and `too_deep` tells the error apart.
"""

from __future__ import annotations

from typing import Any

import orjson

# orjson writes no value nested deeper than this.
ORJSON_DEPTH = 255


def too_deep(error: BaseException | None) -> bool:
    """Whether `error` is a writer's (orjson's or Python's) giving up on nesting."""
    if isinstance(error, RecursionError):
        return True
    # orjson's message is its only mark.
    return isinstance(error, TypeError) and str(error) == "Recursion limit reached"


def sorted_json(value: Any) -> bytes:
    """`value` as orjson writes it with sorted keys, at any depth (an explicit stack, no
    recursion); a scalar orjson cannot write (a lone surrogate) by its repr."""
    out = bytearray()
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, bytes):  # a bracket, a comma or a key: written as it is
            out += item
        elif isinstance(item, dict):
            parts: list[Any] = [b"{"]
            for n, key in enumerate(sorted(item, key=str)):
                parts += [b"," if n else b"", _scalar(str(key)) + b":", item[key]]
            stack.extend(reversed([*parts, b"}"]))
        elif isinstance(item, list):
            parts = [b"["]
            for n, element in enumerate(item):
                parts += [b"," if n else b"", element]
            stack.extend(reversed([*parts, b"]"]))
        else:
            out += _scalar(item)
    return bytes(out)


def _scalar(item: object) -> bytes:
    try:
        return orjson.dumps(item)
    except TypeError:
        return repr(item).encode("utf-8", "surrogatepass")
