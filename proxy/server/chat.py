"""POST /v1/chat/completions: the Messages pipeline for OpenAI Chat Completions.

The same steps as proxy/server/messages.py (read, check, prepare, forward, relay or
answer read_result), with the Chat wire: counted and rewritten by the OpenAI dialect,
forwarded to `upstream.openai_url`, and the proxy's own errors in OpenAI's shape.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.server import budgets, errors, observe, pipeline
from proxy.server.auth import caller_of
from proxy.server.headers import upstream_request_headers
from proxy.server.messages import BodyTooLarge, expect_within_limit, read_body
from proxy.server.relay import relay
from proxy.server.routing import OPENAI_UPSTREAM
from proxy.server.state import COMPACTOR, SETTINGS, STORE
from proxy.server.wires import CHAT_WIRE


async def expect_chat(request: web.Request) -> web.StreamResponse | None:
    """`Expect: 100-continue`, answered like the Messages routes, in OpenAI's shape."""
    refused = await expect_within_limit(request)
    return errors.as_openai(refused) if isinstance(refused, web.Response) else refused


def _invalid(message: str) -> web.Response:
    return errors.openai_error(400, message, "invalid_request_error")


async def handle_chat_completions(request: web.Request) -> web.StreamResponse:
    if request.raw_path[:1] != "/":
        return errors.as_openai(errors.not_a_path(request.raw_path))
    app = request.app
    settings = app[SETTINGS]
    limit = settings.server.max_body_bytes
    try:
        body = await read_body(request, limit)
    except BodyTooLarge:
        return errors.as_openai(errors.request_too_large(limit))
    except asyncio.IncompleteReadError:
        return _invalid("The request body ended before its Content-Length.")

    payload: dict[str, Any] | None = None
    compressed = request.headers.get("Content-Encoding", "identity").lower() != "identity"
    if not compressed:
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            return _invalid(f"We could not parse the JSON body of your request: {e}")
        if not isinstance(parsed, dict):
            return _invalid("The request body must be a JSON object.")
        payload = parsed

    upstream = app[OPENAI_UPSTREAM]
    caller = caller_of(request)
    ctx = pipeline.RequestContext(
        route="chat",
        path_qs=request.raw_path,
        headers=request.headers,
        body=body,
        payload=payload,
        settings=settings,
        upstream=upstream,
        store=app[STORE].store,
        compactor=app[COMPACTOR],
        wire=CHAT_WIRE,
        tenant=caller.tenant,
        policy_override=caller.policy,
    )
    forward = await pipeline.prepare(ctx)
    if forward.reply is not None:
        return forward.reply
    refusal = await budgets.reserve(request, ctx, forward)
    if refusal is not None:
        return refusal

    stream = payload.get("stream") is True if payload is not None else b'"stream"' in body
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
        return errors.as_openai(failure)
    observe.upstream_answered(response.headers.get("x-request-id", ""))

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
