"""Match digests: what a message is matched by, and what its count is cached under.

Messages are matched by their *match digest*: the hash of the message with every
`cache_control` removed (agents move their breakpoints to the newest message every turn)
and a string `content` read as one text block (Claude Code sends the same reminder both
ways). What is forwarded is always what the client sent; the digest is only for matching
(a checkpoint's prefix, proxy/core/checkpoint.py; a summary's key). One pass per message
(`fingerprint`) serialises it once and gives both the match digest and the key its token
count is cached under.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

DIGEST_BYTES = 16


@dataclass(frozen=True, slots=True)
class Fingerprint:
    match: bytes  # the message with cache_control removed and string content as a block
    count_key: bytes  # the match digest plus the form it came in: what its count depends on
    breakpoints: int = 0  # cache_control keys in the message


def _hash(data: bytes) -> bytes:
    # sha256 runs on the CPU's SHA extensions where present: twice blake2b's speed here.
    return hashlib.sha256(data).digest()[:DIGEST_BYTES]


def fingerprint(message: Mapping[str, Any]) -> Fingerprint:
    # One orjson call per message: the bytes are hashed while they are in the CPU's cache
    # (one call for the whole list, cut at separators, measured no faster).
    raw = orjson.dumps(message)
    content = message.get("content")
    string_form = isinstance(content, str)
    # A key of the JSON: inside a string its quotes would be escaped.
    breakpoints = raw.count(b'"cache_control"')
    marked = breakpoints > 0
    if not string_form and not marked:
        digest = _hash(raw)
        return Fingerprint(digest, digest + b"\x00")
    canonical: Any = message
    if marked:
        canonical = _without_cache_control(canonical)
    if string_form:
        canonical = {**canonical, "content": [{"type": "text", "text": content}]}
    digest = _hash(orjson.dumps(canonical))
    return Fingerprint(digest, digest + bytes([1 + string_form + 2 * marked]), breakpoints)


def message_digest(message: Mapping[str, Any]) -> bytes:
    return fingerprint(message).match


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
