"""The SSE decoder: any cut of a stream gives the same events."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.core.sse import SSEDecoder, encode_event

STREAM = (
    b'event: message_start\ndata: {"type":"message_start"}\n\n'
    b": a comment\n\n"
    b'event: ping\r\ndata: {"type": "ping"}\r\n\r\n'
    b'event: content_block_delta\rdata: {"a":\rdata: 1}\r\r'
    b"data: no name\n\n"
    b"event: future_event\ndata: " + b"x" * 1_500_000 + b"\n\n"
)


def decode(chunks: list[bytes]) -> list[tuple[str, str]]:
    decoder = SSEDecoder()
    events = []
    for chunk in chunks:
        events += [(e.name, e.data) for e in decoder.feed(chunk)]
    return events


def test_whole_stream() -> None:
    events = decode([STREAM])
    assert [name for name, _ in events] == [
        "message_start",
        "",  # the comment
        "ping",
        "content_block_delta",
        "message",
        "future_event",
    ]
    assert events[3][1] == '{"a":\n1}'
    assert len(events[5][1]) == 1_500_000


@given(st.lists(st.integers(0, len(STREAM)), max_size=40))
def test_any_cut_gives_the_same_events(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    assert decode(chunks) == decode([STREAM])


def test_raw_bytes_are_the_event_as_sent() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(b"event: ping\ndata: {}\n\nevent: x\ndata: 1\n\n")
    assert [e.raw for e in events] == [b"event: ping\ndata: {}\n\n", b"event: x\ndata: 1\n\n"]


def test_an_unterminated_event_is_pending_then_dropped() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"event: message_stop\ndata: {}\n") == []
    assert decoder.pending
    assert decoder.close() == []


def test_encode_round_trips() -> None:
    raw = encode_event("message_delta", b'{"x":1}')
    (event,) = SSEDecoder().feed(raw)
    assert (event.name, event.data, event.raw) == ("message_delta", '{"x":1}', raw)


def test_raw_keeps_the_line_ends_as_sent() -> None:
    crlf = b"event: ping\r\ndata: {}\r\n\r\n"
    (event,) = SSEDecoder().feed(b"\r\n" + crlf)  # a blank line before belongs to no event
    assert event.raw == crlf


def test_a_cr_at_the_end_of_a_chunk_waits_for_its_lf() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"event: ping\r") == []
    assert decoder.feed(b"\ndata: 1\r") == []
    (event,) = decoder.feed(b"\n\r\n")
    assert (event.name, event.data) == ("ping", "1")
