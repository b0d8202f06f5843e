"""POST /v1/messages and /v1/messages/count_tokens: read, check, prepare, forward, relay.

`handle_json_route` is the one request path of every route that carries a conversation;
/v1/chat/completions (proxy/server/chat.py) runs it with the Chat wire and OpenAI's
error shape.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.server import budgets, errors, observe, pipeline
from proxy.server.auth import caller_of
from proxy.server.headers import upstream_request_headers
from proxy.server.relay import relay
from proxy.server.state import COMPACTOR, SETTINGS, STORE, UPSTREAM
from proxy.server.upstream import Upstream
from proxy.server.wires import ANTHROPIC_WIRE, Wire


class BodyTooLarge(Exception):
    pass


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, refusing early once it is over `limit`: by Content-Length before
    reading anything, else by counting while reading a chunked body."""
    length = request.content_length
    if length is not None:
        if length > limit:
            raise BodyTooLarge
        return await request.content.readexactly(length) if length else b""
    chunks: list[bytes] = []
    total = 0
    while chunk := await request.content.readany():
        total += len(chunk)
        if total > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


async def expect_within_limit(request: web.Request) -> web.StreamResponse | None:
    """Answer `Expect: 100-continue`: go on only when the announced body fits, so a client
    with a body over the limit gets its 413 before uploading it."""
    limit = request.app[SETTINGS].server.max_body_bytes
    length = request.content_length
    if length is not None and length > limit:
        return errors.request_too_large(limit)
    if request.headers.get("Expect", "").lower() != "100-continue":
        return errors.error_response(417, "invalid_request_error", "Unsupported Expect header.")
    if request.version >= (1, 1):
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the real response has not started
    return None


def _wants_stream(payload: dict[str, Any] | None, body: bytes) -> bool:
    if payload is not None:
        return payload.get("stream") is True
    return b'"stream"' in body  # unparsed: err towards the stream (idle) timeout


@dataclass(frozen=True, slots=True)
class JsonRoute:
    """What differs between the API routes that carry a conversation."""

    route: pipeline.Route
    upstream: web.AppKey[Upstream]
    wire: Wire = ANTHROPIC_WIRE
    # The proxy's own errors are made in the Messages shape, then put in the route's own.
    shape: Callable[[web.Response], web.Response] = lambda response: response
    bad_json: str = "The request body is not valid JSON"
    request_id_header: str = "request-id"


MESSAGES = JsonRoute("messages", UPSTREAM)
COUNT_TOKENS = JsonRoute("count_tokens", UPSTREAM)


async def handle_json_route(request: web.Request, spec: JsonRoute) -> web.StreamResponse:
    """Read, check, prepare (compaction), reserve (budgets), forward, relay or intercept."""
    if request.raw_path[:1] != "/":
        return spec.shape(errors.not_a_path(request.raw_path))
    app = request.app
    settings = app[SETTINGS]
    limit = settings.server.max_body_bytes
    try:
        body = await read_body(request, limit)
    except BodyTooLarge:
        return spec.shape(errors.request_too_large(limit))
    except asyncio.IncompleteReadError:
        message = "The request body ended before its Content-Length."
        return spec.shape(errors.invalid_request(message))

    payload: dict[str, Any] | None = None
    # A compressed body is forwarded as sent, uninspected (the server does not decompress).
    compressed = request.headers.get("Content-Encoding", "identity").lower() != "identity"
    if not compressed and pipeline.must_parse(len(body), settings):
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            return spec.shape(errors.invalid_request(f"{spec.bad_json}: {e}"))
        if not isinstance(parsed, dict):
            return spec.shape(errors.invalid_request("The request body must be a JSON object."))
        payload = parsed

    upstream = app[spec.upstream]
    caller = caller_of(request)
    ctx = pipeline.RequestContext(
        route=spec.route,
        path_qs=request.raw_path,
        headers=request.headers,
        body=body,
        payload=payload,
        settings=settings,
        upstream=upstream,
        store=app[STORE].store,
        compactor=app[COMPACTOR],
        wire=spec.wire,
        tenant=caller.tenant,
        policy_override=caller.policy,
    )
    forward = await pipeline.prepare(ctx)
    if forward.reply is not None:
        return forward.reply
    refusal = await budgets.reserve(request, ctx, forward)
    if refusal is not None:
        return refusal

    stream = _wants_stream(payload, body)
    observe.upstream_sending()
    try:
        response = await upstream.send(
            request.method,
            request.raw_path,
            forward.upstream_headers or upstream_request_headers(request.headers),
            forward.body,
            stream=stream,
        )
    except (aiohttp.ClientError, TimeoutError) as e:
        failure = errors.for_upstream_failure(e, upstream.base_url, upstream.timeout_for(stream))
        return spec.shape(failure)
    observe.upstream_answered(response.headers.get(spec.request_id_header, ""))

    if forward.intercept_read_result:
        return await pipeline.intercept(request, ctx, forward, response)
    out = await relay(
        request,
        response,
        forward.response_headers,
        base_url=upstream.base_url,
        read_timeout=upstream.timeout_for(stream),
    )
    if forward.calibrate is not None:
        forward.calibrate(observe.relayed_usage())
    return out


async def handle_messages(request: web.Request) -> web.StreamResponse:
    return await handle_json_route(request, MESSAGES)


async def handle_count_tokens(request: web.Request) -> web.StreamResponse:
    return await handle_json_route(request, COUNT_TOKENS)
