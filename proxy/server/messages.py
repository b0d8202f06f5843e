"""POST /v1/messages and /v1/messages/count_tokens: read, check, prepare, forward, relay."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.server import budgets, errors, observe, pipeline
from proxy.server.auth import caller_of
from proxy.server.headers import upstream_request_headers
from proxy.server.relay import relay
from proxy.server.state import COMPACTOR, SETTINGS, STORE, UPSTREAM


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


async def _handle(request: web.Request, route: pipeline.Route) -> web.StreamResponse:
    if request.raw_path[:1] != "/":
        return errors.not_a_path(request.raw_path)
    app = request.app
    settings = app[SETTINGS]
    limit = settings.server.max_body_bytes
    try:
        body = await read_body(request, limit)
    except BodyTooLarge:
        return errors.request_too_large(limit)
    except asyncio.IncompleteReadError:
        return errors.invalid_request("The request body ended before its Content-Length.")

    payload: dict[str, Any] | None = None
    # A compressed body is forwarded as sent, uninspected (the server does not decompress).
    compressed = request.headers.get("Content-Encoding", "identity").lower() != "identity"
    if not compressed and pipeline.must_parse(len(body), settings):
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            return errors.invalid_request(f"The request body is not valid JSON: {e}")
        if not isinstance(parsed, dict):
            return errors.invalid_request("The request body must be a JSON object.")
        payload = parsed

    upstream = app[UPSTREAM]
    caller = caller_of(request)
    ctx = pipeline.RequestContext(
        route=route,
        path_qs=request.raw_path,
        headers=request.headers,
        body=body,
        payload=payload,
        settings=settings,
        upstream=upstream,
        store=app[STORE].store,
        compactor=app[COMPACTOR],
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
        return errors.for_upstream_failure(e, upstream.base_url, upstream.timeout_for(stream))
    observe.upstream_answered(response.headers.get("request-id", ""))

    if forward.intercept_read_result:
        return await pipeline.intercept(request, ctx, forward, response)
    return await relay(
        request,
        response,
        forward.response_headers,
        base_url=upstream.base_url,
        read_timeout=upstream.timeout_for(stream),
        observe=forward.observe,
    )


async def handle_messages(request: web.Request) -> web.StreamResponse:
    return await _handle(request, "messages")


async def handle_count_tokens(request: web.Request) -> web.StreamResponse:
    return await _handle(request, "count_tokens")
