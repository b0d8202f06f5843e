"""Checkpoints: a rewrite decided once, then reapplied byte for byte (DESIGN section 5).

A checkpoint records how the first `covers` messages of a conversation were rewritten
(typed segments, proxy/core/segments.py) and the chained hash of those messages. While a
request starts with the same messages, its history is the segments applied to it plus
the new messages verbatim, so the rewritten prefix is the same bytes on every request and
every replica.

Messages are matched by their *match digest*: the hash of the message with every
`cache_control` removed (agents move their breakpoints to the newest message every turn)
and a string `content` read as one text block (Claude Code sends the same reminder both
ways). What is forwarded is always what the client sent; the digest is only for matching.
One pass per message (`fingerprint`) serialises it once and gives both the match digest
and the key its token count is cached under. The JSON codec of a checkpoint and its
segments is used at the store's edge only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from proxy.core.offload import Stub
from proxy.core.segments import Note, Segment, Stubbed, Summary, Verbatim
from proxy.core.strategy import Strategy

VERSION = 2
DIGEST_BYTES = 16


# -- fingerprints -----------------------------------------------------------------------


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


def checkpoint_slot(digests: Sequence[bytes]) -> str:
    """One checkpoint per first message: agents that share a session id between their
    sub-agents (Claude Code does) keep one frozen prefix each."""
    return digests[0].hex()[:16]


# -- checkpoints ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Checkpoint:
    covers: int  # how many client messages the segments stand for
    prefix_hash: str  # chain_hash of their match digests
    segments: tuple[Segment, ...]
    tool: str | None  # the name read_result was injected under
    strategy: Strategy  # what the crossing that made it did
    summary_key: str | None = None  # the stored summary it holds, if any
    tokens_after: int = 0  # the rewritten history, estimated, when it was made
    # When the TTLs of the refs it names were last renewed (seconds of the shell's clock;
    # 0: never known). Every ref it names was renewed or written since.
    renewed_at: int = 0

    def applies_to(self, digests: Sequence[bytes]) -> bool:
        n = self.covers
        return 0 < n <= len(digests) and chain_hash(digests[:n]) == self.prefix_hash

    def renamed(self, tool: str | None) -> Checkpoint:
        return replace(self, tool=tool)


@dataclass(frozen=True, slots=True)
class Line:
    """One line of a conversation: its checkpoint, and when it was last made or taken
    (a logical clock, higher is more recent: proxy/core/lines.py)."""

    checkpoint: Checkpoint
    used: int = 0

    @property
    def name(self) -> str:
        return self.checkpoint.prefix_hash


def make_checkpoint(
    segments: Sequence[Segment],
    digests: Sequence[bytes],
    *,
    tool: str | None,
    strategy: Strategy,
    summary_key: str | None,
    tokens_after: int,
) -> Checkpoint:
    return Checkpoint(
        covers=len(digests),
        prefix_hash=chain_hash(digests),
        segments=tuple(segments),
        tool=tool,
        strategy=strategy,
        summary_key=summary_key,
        tokens_after=tokens_after,
    )


# -- the codec, at the store edge -------------------------------------------------------


def encode_checkpoint(checkpoint: Checkpoint) -> dict[str, Any]:
    return {
        "v": VERSION,
        "n": checkpoint.covers,
        "hash": checkpoint.prefix_hash,
        "segments": encode_segments(checkpoint.segments),
        "tool": checkpoint.tool,
        "strategy": checkpoint.strategy.value,
        "summary_key": checkpoint.summary_key,
        "after": checkpoint.tokens_after,
        "renewed": checkpoint.renewed_at,
    }


def decode_checkpoint(raw: object) -> Checkpoint | None:
    """A stored checkpoint, or None when it is missing, of another version or malformed
    (the conversation then starts afresh: never a failure)."""
    if not isinstance(raw, dict) or raw.get("v") != VERSION:
        return None
    n, prefix, tool = raw.get("n"), raw.get("hash"), raw.get("tool")
    strategy, key, after = raw.get("strategy"), raw.get("summary_key"), raw.get("after", 0)
    renewed = raw.get("renewed", 0)
    if not isinstance(n, int) or n <= 0 or not isinstance(prefix, str):
        return None
    if not (tool is None or isinstance(tool, str)) or not isinstance(strategy, str):
        return None
    if strategy not in STORED_STRATEGIES:
        return None  # not a word any release wrote
    if not (key is None or isinstance(key, str)) or not isinstance(after, int):
        return None
    if not isinstance(renewed, int) or isinstance(renewed, bool):
        renewed = 0  # renewed at the next crossing
    try:
        segments = decode_segments(raw.get("segments"))
    except SegmentError:
        return None
    return Checkpoint(n, prefix, tuple(segments), tool, Strategy(strategy), key, after, renewed)


def encode_segments(segments: Sequence[Segment]) -> list[list[Any]]:
    out: list[list[Any]] = []
    for seg in segments:
        if isinstance(seg, Verbatim):
            out.append(["m", seg.index])
        elif isinstance(seg, Stubbed):
            out.append(["s", seg.index, [[s.block, s.ref, s.head_chars] for s in seg.stubs]])
        elif isinstance(seg, Summary):
            out.append(["summary", seg.text, seg.folded, list(seg.refs)])
        else:
            out.append(["note", seg.text, seg.dropped])
    return out


class SegmentError(ValueError):
    """A stored segment list that does not decode (treated as no checkpoint)."""


def decode_segments(raw: object) -> list[Segment]:
    if not isinstance(raw, list):
        raise SegmentError("segments must be a list")
    out: list[Segment] = []
    for item in raw:
        if not isinstance(item, list) or not item:
            raise SegmentError(f"bad segment {item!r}")
        kind, rest = item[0], item[1:]
        if kind == "m" and len(rest) == 1 and _index(rest[0]):
            out.append(Verbatim(rest[0]))
        elif kind == "s" and len(rest) == 2 and _index(rest[0]) and isinstance(rest[1], list):
            out.append(Stubbed(rest[0], tuple(_stub(s) for s in rest[1])))
        elif (
            kind == "summary"
            and len(rest) in (2, 3)
            and isinstance(rest[0], str)
            and _index(rest[1])
        ):
            # A summary stored before it recorded its refs vouches for none.
            vouched = rest[2] if len(rest) == 3 else []
            if not isinstance(vouched, list) or not all(isinstance(r, str) for r in vouched):
                raise SegmentError(f"bad segment {item!r}")
            out.append(Summary(rest[0], rest[1], tuple(vouched)))
        elif kind == "note" and len(rest) in (1, 2) and isinstance(rest[0], str):
            dropped = rest[1] if len(rest) == 2 and _index(rest[1]) else 0
            out.append(Note(rest[0], dropped))
        else:
            raise SegmentError(f"bad segment {item!r}")
    return out


def _index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _stub(raw: object) -> Stub:
    if (
        isinstance(raw, list)
        and len(raw) == 3
        and _index(raw[0])
        and isinstance(raw[1], str)
        and _index(raw[2])
    ):
        return Stub(raw[0], raw[1], raw[2])
    raise SegmentError(f"bad stub {raw!r}")


# The stored `strategy` is the member's value: every value a release has written.
STORED_STRATEGIES = frozenset(s.value for s in Strategy)
