"""Checkpoints: a rewrite decided once, then reapplied byte for byte (DESIGN section 5).

A checkpoint records how the first `n` messages of a conversation were rewritten, as a
list of segments over their indices:

    ["m", i]                          message i, verbatim
    ["s", i, [[block, ref, head]...]] message i with some tool results stubbed
    ["summary", text, folded]         a summary of `folded` earlier messages
    ["note", text]                    a note that earlier messages were dropped

and the hash of those `n` messages. While a request starts with the same messages, its
history is the segments applied to it plus the new messages verbatim, so the rewritten
prefix is the same bytes on every request and every replica. The hash ignores
`cache_control`, which agents move to their newest message every turn.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.core.dialect import Dialect
from proxy.core.offload import Stub
from proxy.wire.anthropic import ANTHROPIC

Segment = list[Any]
VERSION = 1


def message_digest(message: Mapping[str, Any]) -> bytes:
    raw = orjson.dumps(message)
    if b'"cache_control"' in raw:
        raw = orjson.dumps(_without_cache_control(message))
    return hashlib.blake2b(raw, digest_size=16).digest()


def _without_cache_control(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_without_cache_control(v) for v in value]
    return value


def chain_hash(digests: Sequence[bytes]) -> str:
    """One hash for a run of message digests, order included."""
    h = hashlib.blake2b(digest_size=16)
    for d in digests:
        h.update(d)
    return h.hexdigest()


def identity(n: int) -> list[Segment]:
    return [["m", i] for i in range(n)]


def segments_for(
    checkpoint: Mapping[str, Any] | None, digests: Sequence[bytes]
) -> tuple[list[Segment], bool]:
    """The segments for a request: the checkpoint's, extended with the new messages.

    Returns (segments, applied); a missing, stale or foreign-shaped checkpoint gives the
    identity and False.
    """
    total = len(digests)
    if not checkpoint or checkpoint.get("v") != VERSION:
        return identity(total), False
    n = checkpoint.get("n")
    segments = checkpoint.get("segments")
    if not isinstance(n, int) or not isinstance(segments, list) or not 0 < n <= total:
        return identity(total), False
    if checkpoint.get("hash") != chain_hash(digests[:n]):
        return identity(total), False  # the agent edited its history: start afresh
    return [*segments, *(["m", i] for i in range(n, total))], True


def materialise(
    segments: Sequence[Segment],
    messages: Sequence[Mapping[str, Any]],
    tool: str | None,
    read_length: int,
    *,
    dialect: Dialect = ANTHROPIC,
) -> list[dict[str, Any]]:
    """The wire messages the segments stand for, built from this request's messages."""
    out: list[dict[str, Any]] = []
    for seg in segments:
        kind = seg[0]
        if kind == "m":
            out.append(dict(messages[seg[1]]))
        elif kind == "s":
            stubs = [Stub(seg[1], block, ref, head) for block, ref, head in seg[2]]
            name = tool or "read_result"
            out.append(dialect.stubbed_message(messages[seg[1]], stubs, name, read_length))
        elif kind == "summary":
            out.append(dialect.summary_message(seg[1], seg[2]))
        elif kind == "note":
            out.append(dialect.note_message(seg[1]))
        else:
            raise ValueError(f"unknown checkpoint segment {kind!r}")
    return out


def made_here(segment: Segment) -> bool:
    return segment[0] in ("summary", "note")


def make_checkpoint(
    segments: Sequence[Segment],
    digests: Sequence[bytes],
    *,
    tool: str | None,
    strategy: str,
    summary_key: str | None,
) -> dict[str, Any]:
    return {
        "v": VERSION,
        "n": len(digests),
        "hash": chain_hash(digests),
        "segments": list(segments),
        "tool": tool,
        "strategy": strategy,
        "summary_key": summary_key,
    }
