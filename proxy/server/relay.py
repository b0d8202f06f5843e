"""Relay an upstream response to the client, byte for byte.

Event streams and large bodies are written chunk by chunk as they arrive (each write goes
straight to the socket); small bodies are read whole and sent in one response. Nothing is
re-framed or decompressed.

When the upstream stream breaks (connection lost, early EOF inside the body) the client
connection is closed the same way, without the final chunk, so the client sees the same
broken stream it would have seen without the proxy. When the upstream goes silent longer
than `upstream.stream_idle_timeout`, the proxy ends the stream itself: at an event
boundary with an `event: error` (type `api_error`) and the normal end of the body, so SDKs
raise a clear error; inside a half-sent event by closing the connection.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy.core.errors import UpstreamError
from proxy.core.wire_format import WireFormat
from proxy.server.errors import render, upstream_failure, wire_for
from proxy.server.headers import client_response_headers
from proxy.server.record import detached

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
    wire: WireFormat | None = None,
) -> web.StreamResponse:
    """Answer `request` with `upstream`'s status, headers and body. Releases `upstream`
    when done, and closes its connection if the relay did not finish. A successful
    answer's bytes go through the request's usage meter on the way (proxy/core/usage.py).
    `wire`: the API spoken (the shape of an error the proxy must put in the stream)."""
    wire = wire or wire_for(request.path, request.headers)
    if 200 <= upstream.status < 300:
        # An answer went through: with no usage found in it, it costs its reservation.
        detached().meter.seen_answer = True
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
    meter = detached().meter
    meter.seen_answer = True
    if encoded or meter.scan is None:
        return
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    if isinstance(answer, dict):
        meter.body(answer)


def _at_event_boundary(last: bytes, before: bytes) -> bool:
    if not last:
        return True
    tail = last if len(last) >= 4 else before[-4:] + last
    return tail.endswith(_EVENT_ENDINGS)


async def _relay_stream(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    headers: CIMultiDict[str],
    wire: WireFormat,
    *,
    events: bool,
) -> web.StreamResponse:
    out = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
    if not events and upstream.content_length is not None:
        out.content_length = upstream.content_length
    await out.prepare(request)
    last = before = b""
    meter = detached().meter if events and upstream.status == 200 else None
    try:
        async for chunk in upstream.content.iter_any():
            await out.write(chunk)
            before, last = last, chunk
            if meter is not None:
                meter.chunk(chunk)
    except TimeoutError:
        upstream.close()
        log.warning("upstream stream idle too long; ending the client stream")
        if events and _at_event_boundary(last, before):
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


def cut_client(request: web.Request) -> None:
    """Close the client connection without finishing the body (no last chunk), so the
    client sees a broken stream rather than a complete one. aiohttp's own write_eof
    after the handler then fails quietly on the closed transport."""
    transport = request.transport
    if transport is not None:
        transport.close()
