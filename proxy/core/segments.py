"""What a rewritten history is made of: typed segments over the client's messages.

A rewrite never copies the client's messages into storage. It is a list of segments,
each standing for something in the history sent upstream:

    Verbatim(i)            message i as the client sent it
    Stubbed(i, stubs)      message i with some tool results replaced by stubs
    Summary(text, folded)  a summary of `folded` earlier client messages
    Note(text)             a note that earlier client messages were dropped

`materialise` builds the wire messages from this request's messages; the same segments
over the same messages give the same bytes on every request and every replica. The JSON
codec below is used only at the store edge (a checkpoint's segments).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proxy.core.offload import Stub

if TYPE_CHECKING:
    from proxy.core.wire_format import Dialect


@dataclass(frozen=True, slots=True)
class StubAt:
    """One stub in a message: the result's slot, its ref, how much of its head stays."""

    slot: int
    ref: str
    head_chars: int


@dataclass(frozen=True, slots=True)
class Verbatim:
    index: int


@dataclass(frozen=True, slots=True)
class Stubbed:
    index: int
    stubs: tuple[StubAt, ...]  # by slot, ascending

    @property
    def refs(self) -> tuple[str, ...]:
        return tuple(s.ref for s in self.stubs)


@dataclass(frozen=True, slots=True)
class Summary:
    text: str
    folded: int  # client messages it stands for


@dataclass(frozen=True, slots=True)
class Note:
    text: str
    dropped: int = 0  # client messages it stands for (0: not recorded)


Segment = Verbatim | Stubbed | Summary | Note


def identity(n: int) -> list[Segment]:
    return [Verbatim(i) for i in range(n)]


def made_here(segment: Segment) -> bool:
    """A summary or note the proxy wrote into the history."""
    return isinstance(segment, (Summary, Note))


def stands_for(segment: Segment) -> int:
    """How many of the client's messages a segment stands for."""
    if isinstance(segment, Summary):
        return segment.folded
    if isinstance(segment, Note):
        return segment.dropped
    return 1


def refs_of(segments: Sequence[Segment]) -> list[str]:
    """Every ref a stub in these segments names, in order."""
    return [ref for seg in segments if isinstance(seg, Stubbed) for ref in seg.refs]


def materialise(
    segments: Sequence[Segment],
    messages: Sequence[Mapping[str, Any]],
    tool: str | None,
    read_length: int,
    dialect: Dialect,
) -> list[dict[str, Any]]:
    """The wire messages the segments stand for, built from this request's messages."""
    out: list[dict[str, Any]] = []
    name = tool or "read_result"
    for seg in segments:
        if isinstance(seg, Verbatim):
            out.append(dict(messages[seg.index]))
        elif isinstance(seg, Stubbed):
            stubs = [Stub(seg.index, s.slot, s.ref, s.head_chars) for s in seg.stubs]
            out.append(dialect.stubbed_message(messages[seg.index], stubs, name, read_length))
        elif isinstance(seg, Summary):
            out.append(dialect.summary_message(seg.text, seg.folded))
        else:
            out.append(dialect.note_message(seg.text))
    return out


# -- the codec, at the store edge -------------------------------------------------------


def encode_segments(segments: Sequence[Segment]) -> list[list[Any]]:
    out: list[list[Any]] = []
    for seg in segments:
        if isinstance(seg, Verbatim):
            out.append(["m", seg.index])
        elif isinstance(seg, Stubbed):
            out.append(["s", seg.index, [[s.slot, s.ref, s.head_chars] for s in seg.stubs]])
        elif isinstance(seg, Summary):
            out.append(["summary", seg.text, seg.folded])
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
        elif kind == "summary" and len(rest) == 2 and isinstance(rest[0], str) and _index(rest[1]):
            out.append(Summary(rest[0], rest[1]))
        elif kind == "note" and len(rest) in (1, 2) and isinstance(rest[0], str):
            dropped = rest[1] if len(rest) == 2 and _index(rest[1]) else 0
            out.append(Note(rest[0], dropped))
        else:
            raise SegmentError(f"bad segment {item!r}")
    return out


def _index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _stub(raw: object) -> StubAt:
    if (
        isinstance(raw, list)
        and len(raw) == 3
        and _index(raw[0])
        and isinstance(raw[1], str)
        and _index(raw[2])
    ):
        return StubAt(raw[0], raw[1], raw[2])
    raise SegmentError(f"bad stub {raw!r}")
