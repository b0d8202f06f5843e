"""Match digests: what a message is matched by.

Messages are matched by their *match digest*: the hash of the message with every
`cache_control` removed (agents move their breakpoints to the newest message every turn)
and a string `content` read as one text block (Claude Code sends the same reminder both
ways). What is forwarded is always what the client sent; the digest is only for matching
(a checkpoint's prefix, proxy/core/checkpoint.py; a summary's key). The digests are
persisted and compared across replicas, so their bytes never change.

`canonical` serialises a message once and gives the JSON its digest is of, with the form
it came in: counting.py keys a message's count by that JSON and form (in-process, cheap:
tokens.CountKey) and takes the digest (sha256) only of a request it goes on to plan.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

DIGEST_BYTES = 16

# Canonical.form, how its json was made from the message's own bytes (in-process only: a
# count key's byte, a stubbed message's memo key):
EXACT = 0  # the message's own bytes
STRING_AS_BLOCK = 2  # its string content read as one text block (pins it exactly still)
UNMARKED = 3  # its cache_control left out (matches messages that place it elsewhere)
UNMARKED_STRING = 4  # both
FORMS = 5  # form values are below this


@dataclass(frozen=True, slots=True)
class Canonical:
    raw: bytes  # the message's JSON as it came
    json: bytes  # ... with cache_control removed and string content as a block (or raw)
    form: int  # how json was made from raw: what a count keyed by json also depends on
    breakpoints: int = 0  # cache_control keys in the message


def digest(data: bytes) -> bytes:
    # sha256 runs on the CPU's SHA extensions where present: twice blake2b's speed here.
    return hashlib.sha256(data).digest()[:DIGEST_BYTES]


def canonical(message: Mapping[str, Any], raw: bytes | None = None) -> Canonical:
    """`raw`: the message's JSON when already made (orjson's writing of it)."""
    # One orjson call per message (one call for the whole list, cut at separators,
    # measured no faster); a second only for a message with a breakpoint or string content.
    if raw is None:
        raw = orjson.dumps(message)
    content = message.get("content")
    string_form = isinstance(content, str)
    # A key of the JSON: inside a string its quotes would be escaped.
    breakpoints = raw.count(b'"cache_control"')
    marked = breakpoints > 0
    if not string_form and not marked:
        return Canonical(raw, raw, EXACT)
    shape: Any = message
    if marked:
        shape = _without_cache_control(shape)
    if string_form:
        shape = {**shape, "content": [{"type": "text", "text": content}]}
    form = (UNMARKED_STRING if string_form else UNMARKED) if marked else STRING_AS_BLOCK
    return Canonical(raw, orjson.dumps(shape), form, breakpoints)


def message_digest(message: Mapping[str, Any]) -> bytes:
    return digest(canonical(message).json)


def _without_cache_control(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_without_cache_control(v) for v in value]
    return value


def chain_hash(digests: Sequence[bytes]) -> str:
    """One hash for a run of message digests, order included."""
    h = hashlib.sha256()
    for d in digests:
        h.update(d)
    return h.hexdigest()[: 2 * DIGEST_BYTES]


def chain_hashes(runs: Iterable[Sequence[bytes]]) -> Iterator[str]:
    """`chain_hash` of the runs' digests so far, after each run: every prefix hashed in
    one pass."""
    h = hashlib.sha256()
    for run in runs:
        for d in run:
            h.update(d)
        yield h.copy().hexdigest()[: 2 * DIGEST_BYTES]
