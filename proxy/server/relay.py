"""Relay an upstream response to the client, byte for byte.

Event streams and large bodies are written chunk by chunk as they arrive (each write goes
straight to the socket); small bodies are read whole and sent in one response, at once,
before the proxy's bookkeeping of them. Nothing is re-framed or decompressed.

When the upstream stream breaks (connection lost, early EOF inside the body) the client
connection is closed the same way, without the final chunk, so the client sees the same
broken stream it would have seen without the proxy. An event stream is written on event
boundaries (its codec's framing, proxy/server/transport.py: the bytes after the last
complete event wait for its end, at most `upstream.max_line_bytes` of them), so when the
upstream goes silent longer than `upstream.stream_idle_timeout`, or sends an event over
that cap, the proxy ends the stream itself as every stream it ends is ended
(`end_with_error`: the API's error event and the normal end of the body), and SDKs
raise a clear error.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy.core.errors import UpstreamError, UpstreamTimeout
from proxy.core.usage import UsageMeter
from proxy.core.wire_format import ErrorShapes
from proxy.server.headers import client_response_headers
from proxy.server.transport import StreamCodec, codec_for, cut_client, end_with_error
from proxy.server.upstream import AnswerTooLarge, Upstream, too_large

log = logging.getLogger(__name__)

# Non-stream bodies up to this size are read whole (one write); larger ones are streamed.
WHOLE_BODY_LIMIT = 4 * 1024 * 1024


async def relay(
    request: web.Request,
    response: aiohttp.ClientResponse,
    upstream: Upstream,
    wire: ErrorShapes,
    meter: UsageMeter,
    extra_headers: Iterable[tuple[str, str]] = (),
    *,
    stream: bool = False,
) -> web.StreamResponse:
    """Answer `request` with `response`'s status, headers and body; the response is
    released when done, closed if the relay did not finish. A successful answer's bytes
    go through the request's usage `meter` on the way (proxy/core/usage.py). `wire`: the
    API spoken (the shape of an error the proxy must put in the stream)."""
    if 200 <= response.status < 300:
        # An answer went through: with no usage found in it, it costs its reservation.
        meter.seen_answer = True
    headers = client_response_headers(response.headers)
    for name, value in extra_headers:
        headers.add(name, value)
    codec = codec_for(response.headers.get("Content-Type", ""))
    length = response.content_length
    small = length is not None and length <= WHOLE_BODY_LIMIT
    if codec is None and (small or request.method == "HEAD"):
        limit = max(length or 0, WHOLE_BODY_LIMIT)  # (a HEAD's length has no body)
        body = await upstream.read(response, limit=limit, stream=stream)
        out = web.Response(
            status=response.status, reason=response.reason, headers=headers, body=body
        )
        # Sent here, before the answer's bookkeeping (its usage read below; the exchange's,
        # the record's and the metrics' once the handler returns), not after all of it. A
        # client gone meanwhile is aiohttp's to see, as when it sends the answer itself.
        with contextlib.suppress(ConnectionError):
            await out.prepare(request)
            await out.write_eof()
        if response.status == 200:
            _meter_body(meter, body, "content-encoding" in headers)
        return out
    return await _relay_stream(request, response, headers, upstream, wire, meter, codec)


class _Stream(web.StreamResponse):
    """A relayed stream whose headers go out with its first bytes when those are already
    in (one send, not two), as aiohttp's whole `Response` sends its own; when nothing of
    the answer has arrived yet they are sent at once (`write(b"")`), as before."""

    _send_headers_immediately = False


def _meter_body(meter: UsageMeter, body: bytes, encoded: bool) -> None:
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
    response: aiohttp.ClientResponse,
    headers: CIMultiDict[str],
    upstream: Upstream,
    wire: ErrorShapes,
    meter: UsageMeter,
    codec: StreamCodec | None,
) -> web.StreamResponse:
    """A body streamed as it arrives: an event stream (`codec`) on event boundaries,
    anything else as its bytes come."""
    out = _Stream(status=response.status, reason=response.reason, headers=headers)
    if codec is None and response.content_length is not None:
        out.content_length = response.content_length
    await out.prepare(request)
    content = response.content
    if not content.total_bytes:  # nothing of the answer yet: the headers go now
        await out.write(b"")
    metered = codec is not None and response.status == 200
    cap = upstream.settings.max_line_bytes
    held = codec.framing(cap) if codec is not None else None
    last = b""  # the answer's last bytes, sent with its end (one write, not two)
    # The usage of bytes sent is read after the next send (or the end), not before the
    # next read: the answer's next bytes, or its end, do not wait for it (`_meter_sent`).
    unread = b""
    # Read here rather than through `upstream.chunks` (an async generator, and its
    # closing: some 15 µs of a streamed answer's CPU): the same reads, the same errors.
    read = content.readany  # b"" at the end
    done = False  # read to its end: the response is released (else closed)
    try:
        while True:
            try:
                chunk = await read()
            except (TimeoutError, aiohttp.ClientError) as e:
                raise upstream.stream_failure(e) from None
            if not chunk:
                done = True
                break
            if held is not None:
                assert codec is not None
                chunk = held.whole_events(chunk)
                if held.over:
                    log.warning("upstream event over %d bytes; ending the stream", cap)
                    event = AnswerTooLarge("an event", cap, "upstream.max_line_bytes")
                    await end_with_error(out, codec, wire, too_large(event))
                    return out
                if not chunk:
                    await out.write(b"")  # (the headers, if they still wait)
                    continue
            if content.at_eof():
                # All of the answer is in (once fed its end, aiohttp's reader
                # raises no more): these bytes go out with the stream's end.
                last = chunk
                continue
            await out.write(chunk)
            if metered:
                if unread:
                    _meter_sent(meter, codec, unread)
                unread = chunk
        metered_last = last
        if held is not None and held.rest:
            last += held.rest  # an unterminated last event, as the upstream sent it
    except UpstreamTimeout as silent:
        log.warning("upstream stream idle too long; ending the client stream")
        if codec is not None:  # written on event boundaries: the stream can end cleanly
            await end_with_error(out, codec, wire, silent)
            return out
        with contextlib.suppress(ConnectionResetError):
            await out.write(b"")
        cut_client(request)
        return out
    except (UpstreamError, ConnectionResetError) as e:
        # A broken upstream stream, or (ConnectionResetError) mostly the client going
        # away before handler cancellation noticed: neither side gets a clean end.
        log.info("stream broke (%s); closing the client stream too", type(e).__name__)
        with contextlib.suppress(ConnectionResetError):
            await out.write(b"")  # the headers, if they still wait, as before the cut
        cut_client(request)
        return out
    finally:
        if done:
            response.release()
        else:
            response.close()
            if unread:  # (sent before the stream broke or the client left)
                _meter_sent(meter, codec, unread)
    try:
        await out.write_eof(last)  # the bytes go to the socket first, then it drains
    finally:
        # Read after they went (off the answer's path); read too when the client left
        # during the drain (they were sent: its final usage reached the client, as when
        # a chunk went before a cancellation).
        if unread:
            _meter_sent(meter, codec, unread)
        if metered and metered_last:
            _meter_sent(meter, codec, metered_last)
    return out


def _meter_sent(meter: UsageMeter, codec: StreamCodec | None, sent: bytes) -> None:
    """Read the usage in bytes of a stream that went to the client."""
    assert codec is not None
    meter.chunk(codec.usage_lines(sent))
