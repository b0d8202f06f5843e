"""Checkpoints: a rewrite decided once, then reapplied byte for byte
(docs/design.md#over-the-thresholds).

A checkpoint records how the first `covers` messages of a conversation were rewritten
(typed segments, proxy/core/segments.py) and the chained hash of those messages' match
digests (proxy/core/digests.py). While a request starts with the same messages, its
history is the segments applied to it plus the new messages verbatim, so the rewritten
prefix is the same bytes on every request and every replica. The JSON codec of a
checkpoint and its segments is used at the store's edge only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.core.offload import Stub
from proxy.core.segments import Note, Segment, Stubbed, Summary, Verbatim
from proxy.core.strategy import Strategy

VERSION = 2


def root_of(digests: Sequence[bytes]) -> str:
    """One checkpoint per first message: agents that share a session id between their
    sub-agents (Claude Code does) keep one frozen prefix each."""
    return digests[0].hex()[:16]


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
    try:
        kind = Strategy(strategy)  # a member's value is the word every release stored
    except ValueError:
        return None  # not a word any release wrote
    if not (key is None or isinstance(key, str)) or not isinstance(after, int):
        return None
    if not isinstance(renewed, int) or isinstance(renewed, bool):
        renewed = 0  # renewed at the next crossing
    try:
        segments = decode_segments(raw.get("segments"))
    except SegmentError:
        return None
    return Checkpoint(n, prefix, tuple(segments), tool, kind, key, after, renewed)


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
