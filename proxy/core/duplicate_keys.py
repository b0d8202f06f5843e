"""Duplicate keys in a request body: the proxy and the upstream must read the same numbers.

orjson keeps the last of two equal keys; another parser may keep the first. A body with
`"max_tokens": 50000 ... "max_tokens": 10` would be reserved for 10 and generate 50,000,
and one with two `input` arrays would be counted and compacted for one and sent as the
other. So a body where a field the proxy reads appears twice in one object is refused.

The check is cheap on ordinary bodies, on the hot path: one regular-expression pass over
the bytes finds every key spelled as one of the fields (a JSON string followed by `:`
cannot occur inside a string, whose quotes are escaped). Only when a name is seen more
than once (as nested keys often are: `input` of tool calls, `model` of a tool's schema)
is the parsed body serialised again, with one key per object, and the counts compared:
fewer after means a duplicate. A key written with a `\\u` escape is not seen by that
pass, so a body with one is checked by a parser that sees every key (rare).
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

# What the proxy reads: what a request may generate and cost, where it goes, what is
# counted and compacted.
FIELDS = (
    "model",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "n",
    "stream",
    "messages",
    "system",
    "tools",
    "input",
    "instructions",
    "previous_response_id",
    "requests",
    "params",
    # Gemini's (either spelling): its history, system text and generationConfig's caps.
    "contents",
    "systemInstruction",
    "system_instruction",
    "generationConfig",
    "generation_config",
    "maxOutputTokens",
    "candidateCount",
    "candidate_count",
)
_KEY = re.compile(rb'"(' + b"|".join(f.encode() for f in FIELDS) + rb')"[ \t\r\n]*:')
# A `\u` escape inside a key: from it, the rest of the string, then a colon.
_ESCAPED_KEY = re.compile(rb'\\u[0-9a-fA-F]{4}(?:[^"\\]|\\.)*"[ \t\r\n]*:', re.DOTALL)
_FIELD_SET = frozenset(FIELDS)


def duplicated(raw: bytes, parsed: Any) -> str | None:
    """Why a body is declined when a field the proxy reads is given twice in one object
    (the proxy read the last, the upstream may obey the first, and a rewrite would send
    only the last), else None."""
    name = duplicate_field(raw, parsed)
    return f"the key {name!r} appears more than once in one object" if name else None


def duplicate_field(raw: bytes, parsed: Any) -> str | None:
    """The name of a field the proxy reads that appears twice in one object of the JSON
    body `raw` (already parsed, by orjson, as `parsed`), else None."""
    seen = _KEY.findall(raw)
    if len(seen) > 1 and len(set(seen)) < len(seen):
        counts: dict[bytes, int] = {}
        for name in seen:
            counts[name] = counts.get(name, 0) + 1
        repeated = {name for name, count in counts.items() if count > 1}
        again: dict[bytes, int] = {}
        for name in _KEY.findall(orjson.dumps(parsed)):
            if name in repeated:
                again[name] = again.get(name, 0) + 1
        for name in repeated:
            if again.get(name, 0) < counts[name]:
                return name.decode()
    if b"\\u" in raw and _ESCAPED_KEY.search(raw) is not None:
        return _duplicate_by_parsing(raw)
    return None


def _duplicate_by_parsing(raw: bytes) -> str | None:
    found: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        names = [name for name, _ in items]
        if not found and len(set(names)) < len(names):
            seen: set[str] = set()
            for name in names:
                if name in seen and name in _FIELD_SET:
                    found.append(name)
                    break
                seen.add(name)
        return dict(items)

    try:
        json.loads(raw, object_pairs_hook=pairs)
    except ValueError:
        return None  # orjson read it: the difference is not a duplicate key
    return found[0] if found else None
