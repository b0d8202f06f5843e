"""Relay an upstream response to the client, byte for byte.

Event streams and large bodies are written chunk by chunk as they arrive (each write goes
straight to the socket); small bodies are read whole and sent in one response. Nothing is
re-framed or decompressed.

When the upstream stream breaks (connection lost, early EOF inside the body) the client
connection is closed the same way, without the final chunk, so the client sees the same
broken stream it would have seen without the proxy. An event stream is written on event
boundaries (`EventHold`: the bytes after the last complete event wait for its end, at
most `upstream.max_line_bytes` of them), so when the upstream goes silent longer than
`upstream.stream_idle_timeout`, or sends an event over that cap, the proxy ends the
stream itself with an `event: error` (type `api_error`) and the normal end of the body,
and SDKs raise a clear error.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy.core.errors import UpstreamError, UpstreamGarbage
from proxy.core.wire_format import ErrorShapes
from proxy.server.errors import render, upstream_failure, wire_for
from proxy.server.headers import client_response_headers
from proxy.server.record import current_or_throwaway
from proxy.server.state import SETTINGS

log = logging.getLogger(__name__)

# Non-stream bodies up to this size are read whole (one write); larger ones are streamed.
WHOLE_BODY_LIMIT = 4 * 1024 * 1024
_EVENT_ENDINGS = (b"\n\n", b"\r\r", b"\r\n\r\n")


def is_event_stream(response: aiohttp.ClientResponse) -> bool:
    return response.headers.get("Content-Type", "").startswith("text/event-stream")


async def relay(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    extra_headers: Iterable[tuple[str, str]] = (),
    *,
    base_url: str = "upstream",
    read_timeout: float = 0.0,
    wire: ErrorShapes | None = None,
) -> web.StreamResponse:
    """Answer `request` with `upstream`'s status, headers and body. Releases `upstream`
    when done, and closes its connection if the relay did not finish. A successful
    answer's bytes go through the request's usage meter on the way (proxy/core/usage.py).
    `wire`: the API spoken (the shape of an error the proxy must put in the stream)."""
    wire = wire or wire_for(request.path, request.headers)
    if 200 <= upstream.status < 300:
        # An answer went through: with no usage found in it, it costs its reservation.
        current_or_throwaway().meter.seen_answer = True
    headers = client_response_headers(upstream.headers)
    for name, value in extra_headers:
        headers.add(name, value)
    done = False
    try:
        if is_event_stream(upstream):
            out = await _relay_stream(request, upstream, headers, wire, events=True)
        else:
            length = upstream.content_length
            if (length is not None and length <= WHOLE_BODY_LIMIT) or request.method == "HEAD":
                try:
                    body = await upstream.read()
                except (aiohttp.ClientError, TimeoutError) as e:
                    return render(upstream_failure(e, base_url, read_timeout), wire)
                out = web.Response(
                    status=upstream.status, reason=upstream.reason, headers=headers, body=body
                )
                if upstream.status == 200:
                    _meter_body(body, "content-encoding" in headers)
            else:
                out = await _relay_stream(request, upstream, headers, wire, events=False)
        done = True
        return out
    finally:
        if done:
            upstream.release()
        else:
            upstream.close()


def _meter_body(body: bytes, encoded: bool) -> None:
    meter = current_or_throwaway().meter
    meter.seen_answer = True
    if encoded or meter.scan is None:
        return
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    if isinstance(answer, dict):
        meter.body(answer)


async def _relay_stream(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    headers: CIMultiDict[str],
    wire: ErrorShapes,
    *,
    events: bool,
) -> web.StreamResponse:
    out = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
    if not events and upstream.content_length is not None:
        out.content_length = upstream.content_length
    await out.prepare(request)
    meter = current_or_throwaway().meter if events and upstream.status == 200 else None
    held = EventHold(_max_line(request)) if events else None
    try:
        async for chunk in upstream.content.iter_any():
            if held is not None:
                chunk = held.whole_events(chunk)
                if held.over:
                    upstream.close()
                    log.warning("upstream event over %d bytes; ending the stream", held.cap)
                    await out.write(wire.stream_error(_too_long(held.cap)))
                    await out.write_eof()
                    return out
                if not chunk:
                    continue
            await out.write(chunk)
            if meter is not None:
                meter.chunk(chunk)
        if held is not None and held.rest:
            await out.write(held.rest)  # an unterminated last event, as the upstream sent it
    except TimeoutError:
        upstream.close()
        log.warning("upstream stream idle too long; ending the client stream")
        if events:  # written on event boundaries: the stream can end cleanly
            message = "compaction-proxy: the upstream stream went silent; ended by the proxy"
            await out.write(wire.stream_error(UpstreamError(message)))
            await out.write_eof()
            return out
        cut_client(request)
        return out
    except ConnectionResetError:
        # Mostly the client going away before handler cancellation noticed; either way
        # neither side gets a clean end.
        upstream.close()
        cut_client(request)
        return out
    except aiohttp.ClientError as e:
        upstream.close()
        log.info("upstream stream broke (%s); closing the client stream too", type(e).__name__)
        cut_client(request)
        return out
    await out.write_eof()
    return out


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


def _max_line(request: web.Request) -> int:
    return request.app[SETTINGS].upstream.max_line_bytes


def _too_long(cap: int) -> UpstreamError:
    return UpstreamGarbage(
        f"compaction-proxy: an upstream event was over {cap} bytes"
        " (upstream.max_line_bytes); the stream was ended"
    )


def cut_client(request: web.Request) -> None:
    """Close the client connection without finishing the body (no last chunk), so the
    client sees a broken stream rather than a complete one. aiohttp's own write_eof
    after the handler then fails quietly on the closed transport."""
    transport = request.transport
    if transport is not None:
        transport.close()
