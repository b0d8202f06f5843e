"""AWS's event stream (`application/vnd.amazon.eventstream`) as a stream codec
(proxy/server/transport.py): how Bedrock's `invoke-with-response-stream` answers are
relayed, read and written.

- relayed: cut on message boundaries (each message's prelude says its length), passed as
  the upstream's bytes; the usage meter reads the Anthropic events the `chunk` messages
  carry;
- read (a merged answer's rounds): each `chunk` message is the Anthropic event it
  carries, each `exception` message an Anthropic `error` event naming the exception, so
  the Messages merger reads Bedrock's streams as it reads Anthropic's; bytes that are no
  event stream end the answer with an error event (never a crash, never half a message);
- written: every event the merger lets through is a `chunk` message of the proxy's own,
  its prelude and message CRCs computed (proxy/core/eventstream.py), an error event an
  `exception` message in Bedrock's naming (`throttlingException`, ...). A merged answer's
  last event carries `amazon-bedrock-invocationMetrics` for the usage the client was told
  (`MergedEventStream`, one per answer), the latencies measured by the proxy.
"""

from __future__ import annotations

import struct
import time
from typing import Any

import orjson

from proxy.core.eventstream import PRELUDE, EventStreamDecoder, EventStreamError, Message
from proxy.core.sse import Event, SSEDecoder, encode_event
from proxy.core.usage import Usage
from proxy.server.transport import EventHold, StreamCodec, codec_for, register_codec
from proxy.wire.anthropic import stream_error_event
from proxy.wire.anthropic_bedrock import (
    EVENT_STREAM,
    METRICS_FIELD,
    chunk_event,
    chunk_frame,
    exception_for,
    exception_frame,
    exception_name,
    invocation_metrics,
)

UNREADABLE = "compaction-proxy could not read the upstream's event stream"


class ChunkEvents:
    """Upstream event stream bytes to the Anthropic events they carry (`EventDecoder`)."""

    def __init__(self) -> None:
        self._decoder = EventStreamDecoder()
        self._broken = False

    @property
    def buffered(self) -> int:
        return self._decoder.buffered

    def feed(self, chunk: bytes) -> list[Event]:
        if self._broken:
            return []
        try:
            messages = self._decoder.feed(chunk)
        except EventStreamError:
            self._broken = True
            return [_error_event("internalServerException", UNREADABLE)]
        events = []
        for message in messages:
            carried = chunk_event(message)
            if carried is not None:
                events.append(_anthropic_event(carried))
                continue
            name = exception_name(message)
            if name is not None:
                events.append(_error_event(name, _said(message)))
        return events


def _anthropic_event(data: bytes) -> Event:
    try:
        parsed = orjson.loads(data)
        name = str(parsed.get("type", "")) if isinstance(parsed, dict) else ""
    except orjson.JSONDecodeError:
        name = ""
    text = data.decode("utf-8", "replace")
    return Event(name or "message", text, encode_event(name or "message", data))


def _error_event(name: str, message: str) -> Event:
    raw = stream_error_event(name, message)
    return Event("error", raw.split(b"data: ", 1)[1].strip().decode(), raw)


def _said(message: Message) -> str:
    try:
        payload = orjson.loads(message.payload)
    except orjson.JSONDecodeError:
        return "the upstream's stream ended with an error"
    text = payload.get("message") if isinstance(payload, dict) else None
    return text if isinstance(text, str) else "the upstream's stream ended with an error"


class MessageHold(EventHold):
    """A relay's cut of an event stream (`Framing`): whole messages pass, the rest of
    one (at most `cap` bytes) waits for its end."""

    __slots__ = ()

    def whole_events(self, chunk: bytes) -> bytes:
        held = self._held
        held += chunk
        end = 0
        while len(held) - end >= PRELUDE:
            (total,) = struct.unpack_from(">I", held, end)
            if total < PRELUDE or len(held) - end < total:
                break
            end += total
        out = bytes(held[:end])
        del held[:end]
        self.over = len(held) > self.cap
        return out


class AwsEventStream:
    """The event stream codec (`StreamCodec`), registered for its content type."""

    content_type = EVENT_STREAM

    def decoder(self) -> ChunkEvents:
        return ChunkEvents()

    def framing(self, cap: int) -> MessageHold:
        return MessageHold(cap)

    def encode(self, event: bytes) -> bytes:
        out = b""
        for parsed in SSEDecoder().feed(event):
            out += self._message(parsed)
        return out

    def _message(self, event: Event) -> bytes:
        if event.name == "error":
            found = _object(event.data).get("error")
            error = found if isinstance(found, dict) else {}
            return exception_frame(
                exception_for(str(error.get("type", ""))), str(error.get("message", ""))
            )
        return chunk_frame(event.data.encode())

    def usage_lines(self, chunk: bytes) -> bytes:
        """Whole messages (a relay's cut) as the SSE lines the usage meter reads."""
        try:
            messages = EventStreamDecoder().feed(chunk)
        except EventStreamError:
            return b""
        out = []
        for message in messages:
            carried = chunk_event(message)
            if carried is not None:
                out.append(b"data: " + carried + b"\n\n")
        return b"".join(out)


_USAGE = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


class MergedEventStream(AwsEventStream):
    """The codec of one merged answer: its last event's invocation metrics are the
    usage the client's events told (message_start's, then the final message_delta's),
    with the latencies the proxy saw from the first round's answer."""

    def __init__(self) -> None:
        self._began = time.monotonic()
        self._first: float | None = None
        self._usage: dict[str, Any] = {}

    def _message(self, event: Event) -> bytes:
        if self._first is None:
            self._first = time.monotonic()
        if event.name == "message_start":
            message = _object(event.data).get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            self._usage.update(usage if isinstance(usage, dict) else {})
        elif event.name == "message_delta":
            usage = _object(event.data).get("usage")
            self._usage.update(usage if isinstance(usage, dict) else {})
        elif event.name == "message_stop":
            stop = {**_object(event.data), METRICS_FIELD: self._metrics()}
            return chunk_frame(orjson.dumps(stop))
        return super()._message(event)

    def _metrics(self) -> dict[str, int]:
        told = {k: v for k, v in self._usage.items() if isinstance(v, int)}
        usage = Usage(**{k: told.get(k, 0) for k in (*_USAGE, "output_tokens")})
        now = time.monotonic()
        first = self._first if self._first is not None else now
        latency = round((now - self._began) * 1000)
        return invocation_metrics(usage, latency, round((first - self._began) * 1000))


def _object(data: str) -> dict[str, Any]:
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


EVENT_STREAM_CODEC = AwsEventStream()
register_codec(EVENT_STREAM_CODEC)


def merged_codecs(content_type: str) -> StreamCodec | None:
    """A Bedrock route's codecs (`Codecs`): a merged answer's event stream gets a codec
    of its own (its metrics); anything else as registered."""
    codec = codec_for(content_type)
    return MergedEventStream() if codec is EVENT_STREAM_CODEC else codec
