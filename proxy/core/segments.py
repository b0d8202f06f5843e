"""What a rewritten history is made of: typed segments over the client's messages.

A rewrite never copies the client's messages into storage. It is a list of segments,
each standing for something in the history sent upstream:

    Verbatim(i)            message i as the client sent it
    Stubbed(i, stubs)      message i with some tool results replaced by stubs
    Summary(text, folded)  a summary of `folded` earlier client messages (and the refs
                           the proxy vouches for in it: see `Summary.refs`)
    Note(text)             a note that earlier client messages were dropped

`material` builds a wire message from this request's messages; the same segments
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
class Verbatim:
    index: int


@dataclass(frozen=True, slots=True)
class Stubbed:
    index: int
    stubs: tuple[Stub, ...]  # by block, ascending

    @property
    def refs(self) -> tuple[str, ...]:
        return tuple(s.ref for s in self.stubs)


@dataclass(frozen=True, slots=True)
class Summary:
    text: str
    folded: int  # client messages it stands for
    # The refs this summary makes readable: those its text names that the proxy itself
    # put into the history it folded (a stub it made there, or an earlier summary's own
    # refs). A ref-shaped string the client typed, quoted by the summariser or by the
    # line of identifiers, is never one of them (DESIGN invariant 11).
    refs: tuple[str, ...] = ()


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


def vouched_refs(segments: Sequence[Segment]) -> list[str]:
    """Every ref the proxy itself put into these segments: its stubs', then the refs its
    summaries vouch for. Nothing a client message says counts (a Verbatim segment)."""
    named = dict.fromkeys(refs_of(segments))
    for seg in segments:
        if isinstance(seg, Summary):
            named.update(dict.fromkeys(seg.refs))
    return list(named)


def material(
    seg: Segment,
    messages: Sequence[Mapping[str, Any]],
    tool: str | None,
    read_length: int,
    dialect: Dialect,
) -> dict[str, Any]:
    """The wire message one segment stands for."""
    if isinstance(seg, Verbatim):
        return dict(messages[seg.index])
    if isinstance(seg, Stubbed):
        name = tool or "read_result"
        return dialect.stubbed_message(messages[seg.index], seg.stubs, name, read_length)
    if isinstance(seg, Summary):
        return dialect.summary_message(seg.text, seg.folded)
    return dialect.note_message(seg.text)


# Stubbed messages already built, with their counts, by what makes them (the original's
# exact digest, the stubs, the tool's name, the read length, the format): a conversation
# resends its whole history every turn, and every stub of its checkpoint would otherwise
# be rebuilt and recounted each time. The shell owns it and bounds it (plain dict
# operations, so planning threads may share it); entries are never mutated.
StubbedMemo = dict[bytes, tuple[dict[str, Any], int]]


def stubbed_key(
    digest: bytes, form: int, seg: Stubbed, tool: str | None, read_length: int, dialect: Dialect
) -> bytes:
    stubs = ";".join(f"{s.block},{s.ref},{s.head_chars}" for s in seg.stubs)
    made = f"{form}|{type(dialect).__name__}|{tool or 'read_result'}|{read_length}|{stubs}"
    return digest + made.encode()


REBUILDABLE_FORMS = (0, 1)  # counting.Counted.forms whose digest pins the message exactly


# -- the codec, at the store edge -------------------------------------------------------


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
