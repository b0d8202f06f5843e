"""Transports: how an exchange's request comes in, how each round of it goes upstream,
and how its answer reaches the client.

An exchange (proxy/server/exchange.py) is the same for every API and every transport; a
transport is the part that differs between HTTP (proxy/server/http_transport.py: the
answer whole, or a stream in one of the `StreamCodec`s below) and the Responses
WebSocket (proxy/server/ws_transport.py). It gives the exchange:

- `read()`: the request as read (`Incoming`);
- `relay(outgoing)`: send the request and give the client the upstream's answer as it
  comes (bytes for bytes over HTTP, frames over a WebSocket);
- `merging(outgoing)`: a `Merging`, for an answer whose read_result rounds the proxy
  answers: each `round(body)` sends one round and passes on what the client may see of
  its answer (the format's merger decides), `finish(ended)` ends the client's answer.
  Round 1 is the request itself: a transport tells rounds apart only by whether the
  client's answer has started (an upstream refusal before it is relayed as it came;
  after it, it ends the stream as an error event).

A stream codec is what an HTTP stream's framing is: upstream bytes to events (the SSE
`Event`s every merger reads), the client's events back to bytes, where events end (so a
relay never sends half of one), and how a stream the proxy must end is ended. Server-sent
events are the one registered here; a framing of another provider's (AWS's event stream,
Gemini's JSON array) is a module of its own that registers its codec, by content type,
with `register_codec` (or that its route passes to its HTTP transport).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from aiohttp import web
from multidict import CIMultiDict

from proxy.core.commands import Answered, Failed
from proxy.core.errors import ProxyError
from proxy.core.per_request import per_request
from proxy.core.rounds import Ended
from proxy.core.sse import Event, SSEDecoder
from proxy.core.wire_format import ErrorShapes
from proxy.server.bodies import Incoming

A = TypeVar("A", covariant=True)

# Given the body of an upstream 400 or 422, an answer to give instead (None: relay it).
Refused = Callable[[bytes], Awaitable[web.StreamResponse | None]]


@per_request
class Outgoing:
    """What an exchange sends upstream, and what the client is told besides the answer."""

    body: bytes  # round 1: the request as compaction left it
    sent: Mapping[str, Any] | None  # ... parsed (None: a body never read)
    headers: tuple[tuple[str, str], ...]  # x-compaction-* for the client
    rewritten: bool  # not the client's bytes (its Content-Encoding no longer applies)
    stream: bool  # the client asked for a stream (the idle timeout applies)
    tool: str | None = None  # read_result's name: the proxy answers those calls
    on_refusal: Refused | None = None  # an API's own step may answer an upstream 400/422
    # Round 1 has a listed form to send should the upstream refuse it with a 400 (read_result
    # deferred by the proxy's choice): that refusal is not the client's answer, the
    # listed one's is (`Merging.round` answers Failed(REFUSED) for it, once).
    relists: bool = False

    @property
    def reads_answer(self) -> bool:
        """The proxy reads what comes back (asked uncompressed)."""
        return self.tool is not None or self.on_refusal is not None


class Merging(Protocol[A]):
    """One answer made of read_result rounds (proxy/core/rounds.py), as the client sees it."""

    async def round(self, body: bytes) -> Answered | Failed:
        """Send one round; pass on what the client may see of its answer."""
        ...

    async def finish(self, ended: Ended) -> A:
        """End the client's answer as the rounds ended (`ended.note`: why they stopped)."""
        ...


class Transport(Protocol[A]):
    """What differs between HTTP and a WebSocket for one exchange; `A` is its answer
    (an aiohttp response over HTTP, the end event over a WebSocket)."""

    async def read(self) -> Incoming: ...

    async def answer(self, made: web.StreamResponse) -> A:
        """An answer the proxy made itself (an API's own step served the request)."""
        ...

    async def relay(self, outgoing: Outgoing) -> A: ...

    def merging(self, outgoing: Outgoing) -> Merging[A]: ...


# -- stream codecs ------------------------------------------------------------------------


class EventDecoder(Protocol):
    def feed(self, chunk: bytes) -> list[Event]: ...

    @property
    def buffered(self) -> int:
        """Bytes of an event not yet whole (bounded by upstream.max_line_bytes)."""
        ...


class Framing(Protocol):
    """A relay's view of a stream: the bytes of whole events, the rest held back."""

    over: bool  # the event being held is longer than the cap: the stream must end

    def whole_events(self, chunk: bytes) -> bytes: ...

    @property
    def rest(self) -> bytes:
        """What is held when the stream ends (an unterminated last event)."""
        ...


class StreamCodec(Protocol):
    """An HTTP stream's framing (server-sent events; AWS's event stream, ...)."""

    content_type: str

    def decoder(self) -> EventDecoder:
        """Upstream bytes to the events the format's merger reads."""
        ...

    def framing(self, cap: int) -> Framing:
        """For a relay: upstream bytes cut on event boundaries, at most `cap` held."""
        ...

    def encode(self, event: bytes) -> bytes:
        """One event as a merger writes it (an encoded SSE event) in this framing."""
        ...

    def usage_lines(self, chunk: bytes) -> bytes:
        """Relayed bytes as the SSE lines the usage meter reads (proxy/core/usage.py)."""
        ...


_EVENT_ENDINGS = (b"\n\n", b"\r\r", b"\r\n\r\n")


class EventHold:
    """Writes an event stream on event boundaries: what follows the last complete event
    of the bytes so far is held (one event: bounded by `cap`) until its end arrives, so
    the client never gets half an event the proxy must then end the stream inside, and
    no event longer than the cap is held. Chunks that end on a boundary (nearly all)
    pass as they are."""

    __slots__ = ("_held", "cap", "over")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._held = bytearray()
        self.over = False

    @property
    def rest(self) -> bytes:
        return bytes(self._held)

    def whole_events(self, chunk: bytes) -> bytes:
        held = self._held
        if held:
            start = max(0, len(held) - 3)  # an ending split across the chunks
            held += chunk
            end = _last_event_end(held, start)
            if end == 0:
                self.over = len(held) > self.cap
                return b""
            out = bytes(held[:end])
            del held[:end]
        elif chunk.endswith(_EVENT_ENDINGS):
            return chunk  # the common case: the chunk ends an event
        else:
            end = _last_event_end(chunk, 0)
            if end == len(chunk):
                return chunk
            out = chunk[:end]
            held += chunk[end:]
        self.over = len(held) > self.cap
        return out


def _last_event_end(data: bytes | bytearray, start: int) -> int:
    """Where the last complete event in `data` ends (0: none), searching from `start`."""
    end = 0
    for ending in _EVENT_ENDINGS:
        at = data.rfind(ending, start)
        if at >= 0:
            end = max(end, at + len(ending))
    return end


class ServerSentEvents:
    """Server-sent events: the framing every API here streams in over HTTP."""

    content_type = "text/event-stream"

    def decoder(self) -> SSEDecoder:
        return SSEDecoder()

    def framing(self, cap: int) -> EventHold:
        return EventHold(cap)

    def encode(self, event: bytes) -> bytes:
        return event

    def usage_lines(self, chunk: bytes) -> bytes:
        return chunk


SSE = ServerSentEvents()
_CODECS: dict[str, StreamCodec] = {SSE.content_type: SSE}


def register_codec(codec: StreamCodec) -> None:
    """Answers of `codec.content_type` are streams in that framing (one call, at import
    of the codec's module)."""
    _CODECS[codec.content_type] = codec


Codecs = Callable[[str], StreamCodec | None]  # an answer's Content-Type to its framing
# A whole answer merged from rounds: its headers (the first round's) made true of it
# (a provider that tells usage in headers too: Bedrock's invocation metrics).
MergedHeaders = Callable[[CIMultiDict[str], Mapping[str, Any]], None]


def codec_for(content_type: str) -> StreamCodec | None:
    """The framing of an answer of this Content-Type; None: not a stream."""
    return _CODECS.get(content_type.partition(";")[0].strip().lower())


# -- ending a stream that started ---------------------------------------------------------


async def end_with_error(
    out: web.StreamResponse, codec: StreamCodec, wire: ErrorShapes, error: ProxyError
) -> None:
    """End a client stream that started, cleanly, with the API's error event: how every
    stream the proxy must end itself ends (the upstream went silent, or sent an event
    over the cap or one the proxy cannot read), so SDKs raise a clear error."""
    await out.write(codec.encode(wire.stream_error(error)))
    await out.write_eof()


def cut_client(request: web.Request) -> None:
    """Close the client connection without finishing the body (no last chunk), so the
    client sees a broken stream rather than a complete one, as the upstream's broke.
    aiohttp's own write_eof after the handler then fails quietly on the closed transport."""
    transport = request.transport
    if transport is not None:
        transport.close()
