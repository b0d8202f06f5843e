"""What a rewritten history is made of: typed segments over the client's messages.

A rewrite never copies the client's messages into storage. It is a list of segments,
each standing for something in the history sent upstream:

    Verbatim(i)            message i as the client sent it
    Stubbed(i, stubs)      message i with some tool results replaced by stubs
    Summary(text, folded)  a summary of `folded` earlier client messages (and the refs
                           the proxy vouches for in it: see `Summary.refs`)
    Note(text)             a note that earlier client messages were dropped

`material` builds a wire message from this request's messages; the same segments
over the same messages give the same bytes on every request and every replica. Their JSON
codec is the checkpoint's, at the store edge (proxy/core/checkpoint.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proxy.core.offload import Stub, stub_text

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
    # line of identifiers, is never one of them (docs/design.md#provenance).
    refs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Note:
    text: str
    dropped: int = 0  # client messages it stands for (0: not recorded)


Segment = Verbatim | Stubbed | Summary | Note


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


def last_stub(segments: Sequence[Segment]) -> int | None:
    """Where the stubbed region ends: the last stubbed message (the proxy's breakpoint)."""
    return next(
        (n for n in range(len(segments) - 1, -1, -1) if isinstance(segments[n], Stubbed)), None
    )


def has_stubs(segments: Sequence[Segment]) -> bool:
    return any(isinstance(seg, Stubbed) for seg in segments)


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
        return stubbed(dialect, messages[seg.index], seg.stubs, name, read_length)
    if isinstance(seg, Summary):
        return dialect.summary_message(seg.text, seg.folded)
    return dialect.note_message(seg.text)


def stubbed(
    dialect: Dialect,
    message: Mapping[str, Any],
    stubs: Sequence[Stub],
    tool: str,
    read_length: int,
) -> dict[str, Any]:
    """A copy of the message with the results at the stubs' blocks replaced by their
    stubs: the proxy writes each stub's text (offload.stub_text, from the result's text as
    the format reads it: `Dialect.tool_results`), the format only puts it in place (a
    result holding anything but text stays as it is)."""
    results = {result.block: result.text for result in dialect.tool_results(message)}
    texts: dict[int, str] = {}
    for stub in stubs:
        text = results.get(stub.block)
        if text is not None:
            texts[stub.block] = stub_text(text, stub.ref, tool, stub.head_chars, read_length)
    return dialect.with_results(message, texts)


# Stubbed messages already built, with their counts, by what makes them (the original's
# exact digest, the stubs, the tool's name, the read length, the format): a conversation
# resends its whole history every turn, and every stub of its checkpoint would otherwise
# be rebuilt and recounted each time. The shell owns it and bounds it (plain dict
# operations, so planning threads may share it); entries are never mutated. It is
# looked up and filled by proxy/core/working.py.
StubbedMemo = dict[bytes, tuple[dict[str, Any], int]]
