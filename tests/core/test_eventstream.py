"""The AWS event stream codec: botocore decodes every frame encoded here, any cut of a
stream gives the same messages, and a corrupt frame is refused, never read."""

from __future__ import annotations

import itertools
import struct
import zlib

import pytest
from botocore.eventstream import EventStreamBuffer
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.eventstream import EventStreamDecoder, EventStreamError, encode_message

NAMES = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40).filter(
    lambda s: len(s.encode()) <= 255
)
HEADERS = st.dictionaries(NAMES, st.text(max_size=60), max_size=5).map(lambda d: list(d.items()))
MESSAGES = st.lists(st.tuples(HEADERS, st.binary(max_size=300)), min_size=1, max_size=6)
Frames = list[tuple[list[tuple[str, str]], bytes]]


def _cuts(stream: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({0, len(stream), *(p % (len(stream) + 1) for p in points)})
    return [stream[a:b] for a, b in itertools.pairwise(edges)]


@given(MESSAGES)
def test_botocore_decodes_every_frame_encoded(
    messages: list[tuple[list[tuple[str, str]], bytes]],
) -> None:
    parser = EventStreamBuffer()
    for headers, payload in messages:
        parser.add_data(encode_message(headers, payload))
    decoded = [(m.headers, m.payload) for m in parser]
    assert decoded == [(dict(h), p) for h, p in messages]


@given(MESSAGES, st.lists(st.integers(min_value=0), max_size=12))
def test_any_cut_gives_the_same_messages(messages: Frames, points: list[int]) -> None:
    frames = [encode_message(h, p) for h, p in messages]
    stream = b"".join(frames)
    decoder = EventStreamDecoder()
    got = [m for chunk in _cuts(stream, points) for m in decoder.feed(chunk)]
    assert [(dict(m.headers), m.payload, m.raw) for m in got] == [
        (dict(h), p, f) for (h, p), f in zip(messages, frames, strict=True)
    ]
    assert not decoder.pending


@given(HEADERS, st.binary(max_size=200), st.data())
def test_a_flipped_bit_anywhere_is_refused(
    headers: list[tuple[str, str]], payload: bytes, data: st.DataObject
) -> None:
    frame = bytearray(encode_message(headers, payload))
    bit = data.draw(st.integers(min_value=0, max_value=len(frame) * 8 - 1))
    frame[bit // 8] ^= 1 << (bit % 8)
    decoder = EventStreamDecoder()
    # Padding after it: a length made longer must still be refused, not awaited.
    with pytest.raises(EventStreamError):
        decoder.feed(bytes(frame) + bytes(64))


def test_a_corrupt_length_is_refused_from_its_prelude_alone() -> None:
    frame = bytearray(encode_message([(":event-type", "chunk")], b"{}"))
    frame[0:4] = struct.pack(">I", 10_000)
    decoder = EventStreamDecoder()
    with pytest.raises(EventStreamError, match=r"(?i)checksum"):
        decoder.feed(bytes(frame[:12]))


def test_lengths_that_cannot_describe_a_message_are_refused() -> None:
    for total, headers in ((8, 0), (20, 9)):
        lengths = struct.pack(">II", total, headers)
        prelude = lengths + struct.pack(">I", zlib.crc32(lengths))
        with pytest.raises(EventStreamError, match="length"):
            EventStreamDecoder().feed(prelude + bytes(8))


def test_a_stream_cut_mid_message_is_pending() -> None:
    frame = encode_message([(":message-type", "event")], b"x" * 50)
    decoder = EventStreamDecoder()
    assert decoder.feed(frame[:30]) == []
    assert decoder.pending and decoder.buffered == 30
    assert [m.payload for m in decoder.feed(frame[30:])] == [b"x" * 50]
    assert not decoder.pending


def test_limits_are_refused_when_encoding() -> None:
    with pytest.raises(ValueError, match="header name"):
        encode_message([("", "v")], b"")
    with pytest.raises(ValueError, match="header value"):
        encode_message([("n", "v" * 40_000)], b"")
