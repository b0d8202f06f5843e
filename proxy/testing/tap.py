"""A recording pass-through: put it between an agent and the proxy to see what the agent
was told (status, headers and the exact response bytes, streamed as they arrive).

`start_tap(target_url)` listens on a loopback port and forwards every request to the
target unchanged (hop-by-hop headers aside), relaying the answer chunk by chunk and
keeping a copy. `told_usage` reads, from a recorded Messages answer (SSE, Bedrock's AWS
event stream, or JSON), the usage the client ended up with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.core.eventstream import EventStreamDecoder, EventStreamError
from proxy.wire.anthropic_bedrock import EVENT_STREAM, chunk_event, exception_name

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding"}
    | {"upgrade", "host", "content-length"}
)


@dataclass
class Exchange:
    method: str
    path_qs: str
    request_headers: dict[str, str]
    request_body: bytes
    status: int = 0
    response_headers: dict[str, str] = field(default_factory=dict)
    response_body: bytes = b""
    complete: bool = False  # the answer was relayed to its end


@dataclass
class RunningTap:
    url: str
    exchanges: list[Exchange]
    runner: web.AppRunner
    session: aiohttp.ClientSession

    async def stop(self) -> None:
        await self.runner.cleanup()
        await self.session.close()


def _forwardable(headers: Any) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}


async def start_tap(target_url: str) -> RunningTap:
    exchanges: list[Exchange] = []
    session = aiohttp.ClientSession(
        auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, sock_read=900)
    )

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {str(k): v for k, v in request.headers.items()}
        exchange = Exchange(request.method, request.path_qs, headers, body)
        exchanges.append(exchange)
        async with session.request(
            request.method,
            target_url + request.path_qs,
            headers=_forwardable(request.headers),
            data=body,
            allow_redirects=False,
        ) as upstream:
            exchange.status = upstream.status
            exchange.response_headers = {str(k): v for k, v in upstream.headers.items()}
            response = web.StreamResponse(
                status=upstream.status, headers=_forwardable(upstream.headers)
            )
            await response.prepare(request)
            received = bytearray()
            try:
                async for chunk in upstream.content.iter_any():
                    received += chunk
                    await response.write(chunk)
            finally:
                exchange.response_body = bytes(received)
            await response.write_eof()
            exchange.complete = True
            return response

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", relay)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return RunningTap(f"http://{host}:{port}", exchanges, runner, session)


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, JSON data) of an SSE body, parsed as SSE clients do (independently of
    the proxy's own decoder); an unfinished last event and non-JSON data are skipped."""
    out = []
    for block in re.split(rb"\r\n\r\n|\n\n|\r\r", raw)[:-1]:
        name, data = "message", []
        for line in re.split(rb"\r\n|\n|\r", block):
            key, _, value = line.partition(b":")
            value = value.removeprefix(b" ")
            if key == b"event":
                name = value.decode()
            elif key == b"data":
                data.append(value)
        try:
            out.append((name, orjson.loads(b"\n".join(data))))
        except orjson.JSONDecodeError:
            continue
    return out


def input_total(usage: dict[str, Any]) -> int:
    """All input tokens of a usage object (fresh, cache-written, cache-read)."""
    return sum(
        int(usage.get(key) or 0)
        for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )


def aws_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, JSON data) of the Anthropic events an AWS event stream (Bedrock's)
    carries, decoded as its clients decode it: every CRC and length checked (raises
    EventStreamError, as a client would fail, on any bad byte or a cut message); an
    exception message as an `error` event naming it."""
    decoder = EventStreamDecoder()
    messages = decoder.feed(raw)
    if decoder.pending:
        raise EventStreamError("the event stream ends inside a message")
    out = []
    for message in messages:
        carried = chunk_event(message)
        if carried is not None:
            data = orjson.loads(carried)
            out.append((str(data.get("type", "")), data))
            continue
        name = exception_name(message) or "unknown"
        error = {"type": name, "message": message.payload.decode(errors="replace")}
        out.append(("error", {"type": "error", "error": error}))
    return out


def stream_events(exchange: Exchange) -> list[tuple[str, dict[str, Any]]] | None:
    """The events of a streamed answer (SSE or AWS's event stream); None: not a stream."""
    content_type = exchange.response_headers.get("Content-Type", "")
    if "text/event-stream" in content_type:
        return sse_events(exchange.response_body)
    if EVENT_STREAM in content_type:
        return aws_events(exchange.response_body)
    return None


def told_usage(exchange: Exchange) -> dict[str, Any] | None:
    """The usage a Messages answer left the client with: a stream's message_start usage
    updated by its message_delta usage (counts there are cumulative), or a JSON body's."""
    if exchange.status != 200:
        return None
    events = stream_events(exchange)
    if events is not None:
        usage: dict[str, Any] | None = None
        for name, data in events:
            if name == "message_start":
                usage = dict(data.get("message", {}).get("usage") or {})
            elif name == "message_delta" and usage is not None:
                usage.update(data.get("usage") or {})
        return usage
    try:
        body = orjson.loads(exchange.response_body)
    except orjson.JSONDecodeError:
        return None
    return body.get("usage") if isinstance(body, dict) else None
