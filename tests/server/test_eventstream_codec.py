"""The AWS event stream codec the Bedrock routes stream with: cut on message boundaries
for a relay, read as the Anthropic events its chunks carry (an exception message or bad
bytes an error event, never a crash), written as frames botocore's parser accepts."""

from __future__ import annotations

import itertools

import orjson
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.eventstream import EventStreamDecoder
from proxy.core.sse import encode_event
from proxy.server.eventstream_codec import (
    EVENT_STREAM_CODEC,
    ChunkEvents,
    MergedEventStream,
    MessageHold,
    merged_codecs,
)
from proxy.server.transport import SSE, codec_for
from proxy.wire.anthropic import stream_error_event
from proxy.wire.anthropic_bedrock import (
    EVENT_STREAM,
    METRICS_FIELD,
    chunk_event,
    chunk_frame,
    exception_frame,
    exception_name,
)

EVENTS = [
    {"type": "message_start", "message": {"usage": {"input_tokens": 12, "output_tokens": 1}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}},
    {"type": "message_stop"},
]
STREAM = b"".join(chunk_frame(orjson.dumps(e)) for e in EVENTS)


def _carried(raw: bytes) -> list[dict[str, object]]:
    decoder = EventStreamDecoder()
    messages = decoder.feed(raw)
    assert not decoder.pending
    return [orjson.loads(chunk_event(m) or b"null") for m in messages]


def test_the_codec_is_registered_and_a_bedrock_route_gets_one_per_answer() -> None:
    assert codec_for(EVENT_STREAM) is EVENT_STREAM_CODEC
    first, second = merged_codecs(EVENT_STREAM), merged_codecs(EVENT_STREAM)
    assert isinstance(first, MergedEventStream) and first is not second
    assert merged_codecs("text/event-stream") is SSE
    assert merged_codecs("application/json") is None


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=8))
def test_a_relay_passes_whole_messages_wherever_the_chunks_are_cut(cuts: list[int]) -> None:
    hold = MessageHold(cap=1 << 20)
    bounds = [0, *sorted(set(cuts)), len(STREAM)]
    passed = b""
    for start, end in itertools.pairwise(bounds):
        out = hold.whole_events(STREAM[start:end])
        if out:
            assert _carried(out)  # each write is whole messages only
        passed += out
    assert passed == STREAM and hold.rest == b"" and not hold.over


def test_a_relay_holds_no_more_than_its_cap() -> None:
    hold = MessageHold(cap=10)
    assert hold.whole_events(STREAM[:30]) == b"" and hold.over


@given(st.integers(min_value=1, max_value=64))
def test_read_as_the_anthropic_events_the_chunks_carry(size: int) -> None:
    decoder = ChunkEvents()
    events = []
    for at in range(0, len(STREAM), size):
        events += decoder.feed(STREAM[at : at + size])
    assert [e.name for e in events] == [e["type"] for e in EVENTS]
    assert [orjson.loads(e.data) for e in events] == EVENTS
    assert decoder.buffered == 0


def test_an_exception_message_is_an_error_event_and_bad_bytes_end_the_stream() -> None:
    decoder = ChunkEvents()
    raw = exception_frame("throttlingException", "Too many requests")
    (event,) = decoder.feed(chunk_frame(orjson.dumps(EVENTS[0])) + raw)[1:]
    assert event.name == "error"
    assert orjson.loads(event.data)["error"] == {
        "type": "throttlingException",
        "message": "Too many requests",
    }
    corrupt = bytearray(chunk_frame(orjson.dumps(EVENTS[1])))
    corrupt[-1] ^= 0xFF  # the message CRC
    broken = ChunkEvents()
    (error,) = broken.feed(bytes(corrupt))
    assert error.name == "error" and "could not read" in error.data
    assert broken.feed(STREAM) == []  # nothing after bytes that are no event stream


def test_written_frames_parse_and_errors_are_bedrocks_exceptions() -> None:
    codec = EVENT_STREAM_CODEC
    written = b"".join(codec.encode(encode_event(e["type"], orjson.dumps(e))) for e in EVENTS)
    assert _carried(written) == EVENTS
    for kind, name in (
        ("overloaded_error", "serviceUnavailableException"),
        ("rate_limit_error", "throttlingException"),
        ("modelStreamErrorException", "modelStreamErrorException"),
    ):
        (message,) = EventStreamDecoder().feed(codec.encode(stream_error_event(kind, "no")))
        assert exception_name(message) == name
        assert orjson.loads(message.payload) == {"message": "no"}


def test_a_merged_answers_last_event_carries_the_usage_it_told() -> None:
    codec = MergedEventStream()
    delta = {**EVENTS[4], "usage": {"input_tokens": 12, "output_tokens": 30}}
    told = [*EVENTS[:4], delta, EVENTS[5]]
    written = b"".join(codec.encode(encode_event(e["type"], orjson.dumps(e))) for e in told)
    stop = _carried(written)[-1]
    metrics = stop.pop(METRICS_FIELD)
    assert stop == {"type": "message_stop"}
    assert isinstance(metrics, dict)
    assert metrics["inputTokenCount"] == 12 and metrics["outputTokenCount"] == 30
    assert metrics["invocationLatency"] >= metrics["firstByteLatency"] >= 0


def test_usage_lines_are_what_the_meter_reads() -> None:
    lines = EVENT_STREAM_CODEC.usage_lines(STREAM)
    assert lines.startswith(b'data: {"type":"message_start"')
    assert lines.count(b"\n\n") == len(EVENTS)
