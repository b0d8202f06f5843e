"""The routes that carry a conversation: POST /v1/messages, /v1/messages/count_tokens,
/v1/chat/completions and /v1/responses, one request path for all of them, made of the
steps of proxy/server/pipeline.py (which the Responses WebSocket runs per frame too):

    read ─► admit (the gate) ─► the API's own step ─► prepare (compaction)
        ─► reserve (budgets) ─► forward
        ─► relay the answer as bytes, or answer read_result rounds (read_rounds.py)
        ─► calibrate

The API's own step (`ConversationRoute.before`, optional) sees the parsed request first:
it may answer it itself, change what is compacted and forwarded, keep read_result out of
it, or take over an upstream refusal (Responses: proxy/server/responses.py).

The body is read within its time (proxy/server/bodies.py); a compressed one is decoded
to be read, never rewritten. A model name out of bounds is refused (400); with budgets,
so is an output cap or a choice count that is not a whole number, as what the request
may generate is what it reserves (its largest cap times its choices).

A request that fits goes out as its original bytes (DESIGN invariant 1); one over its
trigger goes out rewritten. Any failure of the proxy's own compaction parts forwards the
request untouched (invariant 7); refusals the API itself would give are raised as
`ProxyError`s and rendered in the route's shape (proxy/server/errors.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import aiohttp
from aiohttp import web

from proxy.core.errors import ExpectationFailed
from proxy.server.bodies import too_large
from proxy.server.errors import render, upstream_failure
from proxy.server.headers import client_response_headers, upstream_request_headers
from proxy.server.pipeline import (
    ConversationRoute,
    Incoming,
    Refused,
    admit,
    calibrate,
    prepare,
    read,
    reserve,
)
from proxy.server.read_rounds import ReadRounds
from proxy.server.record import current_or_throwaway
from proxy.server.relay import relay
from proxy.server.routing import OPENAI_UPSTREAM
from proxy.server.state import SETTINGS, UPSTREAM
from proxy.server.upstream import Upstream
from proxy.wire import ANTHROPIC, CHAT

log = logging.getLogger(__name__)

MESSAGES = ConversationRoute(UPSTREAM, ANTHROPIC)
COUNT_TOKENS = ConversationRoute(UPSTREAM, ANTHROPIC, compacts=False)
CHAT_COMPLETIONS = ConversationRoute(
    OPENAI_UPSTREAM, CHAT, bad_json="We could not parse the JSON body of your request"
)


ExpectHandler = Callable[[web.Request], Awaitable[web.StreamResponse | None]]


def expect_for(route: ConversationRoute) -> ExpectHandler:
    async def expect_within_limit(request: web.Request) -> web.StreamResponse | None:
        """Answer `Expect: 100-continue`: go on only when the announced body fits, so a
        client with a body over the limit gets its 413 before uploading it."""
        limit = request.app[SETTINGS].server.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            return render(too_large(limit), route.wire)
        if request.headers.get("Expect", "").lower() != "100-continue":
            return render(ExpectationFailed("Unsupported Expect header."), route.wire)
        if request.version >= (1, 1):
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # the real response has not started
        return None

    return expect_within_limit


def _wants_stream(payload: dict[str, Any] | None, body: bytes) -> bool:
    if payload is not None:
        return payload.get("stream") is True
    return b'"stream"' in body  # unparsed: err towards the stream (idle) timeout


async def handle_conversation(request: web.Request, route: ConversationRoute) -> web.StreamResponse:
    record = current_or_throwaway()
    if route.compacts:
        record.reads_answers_as(route.wire)
    # What goes upstream (and to the summariser) of the client's headers: theirs alone.
    headers = upstream_request_headers(request.headers)
    incoming = await read(request, route)
    body, payload = incoming.body, incoming.payload
    output = 0
    if payload is not None:
        record.model = str(payload.get("model", ""))[:128]
        output = await admit(request, route, payload, body)
    adjusted, rewritten = None, False
    if route.before is not None and payload is not None:
        adjusted = await route.before(request, body, payload)
        if adjusted.answer is not None:
            return adjusted.answer
        rewritten = adjusted.body is not body
        if rewritten:  # the step wrote new bytes: plain JSON, whatever the client's were
            incoming = Incoming(adjusted.body, adjusted.payload)
        if not adjusted.read_result:
            incoming = replace(incoming, read_result=False)
        body, payload = incoming.body, incoming.payload
    prepared = await prepare(request, route, incoming, headers)
    if prepared.refusal is not None:
        raise prepared.refusal
    await reserve(request, route, prepared, output)

    app = request.app
    upstream = app[route.upstream]
    if rewritten:
        headers = [(n, v) for n, v in headers if n.lower() != "content-encoding"]
    if prepared.intercepts or (adjusted is not None and adjusted.on_refusal is not None):
        # Answers we read ourselves must arrive uncompressed.
        headers = [(n, v) for n, v in headers if n.lower() != "accept-encoding"]
        headers.append(("Accept-Encoding", "identity"))
    stream = _wants_stream(payload, body)
    record.sending()
    try:
        response = await upstream.send(
            request.method, request.raw_path, headers, prepared.body, stream=stream
        )
    except (aiohttp.ClientError, TimeoutError) as e:
        raise upstream_failure(e, upstream.shown_url, upstream.timeout_for(stream)) from None
    record.answered(response.headers.get(route.wire.request_id_header, ""))

    if adjusted is not None and adjusted.on_refusal is not None and response.status in (400, 422):
        return await _refusal(response, adjusted.on_refusal, upstream)
    if prepared.intercepts:
        rounds = ReadRounds(request, prepared, route.wire, upstream, headers)
        out = await rounds.answer(response)
    else:
        out = await relay(
            request,
            response,
            prepared.headers,
            base_url=upstream.shown_url,
            read_timeout=upstream.timeout_for(stream),
            wire=route.wire,
        )
    calibrate(request, route.wire, prepared)
    return out


async def _refusal(
    response: aiohttp.ClientResponse, take_over: Refused, upstream: Upstream
) -> web.StreamResponse:
    """An upstream refusal the API's own step may answer instead; else relayed as it came."""
    try:
        raw = await upstream.read(response)
    except (aiohttp.ClientError, TimeoutError) as e:
        response.close()
        raise upstream_failure(e, upstream.shown_url, upstream.timeout_for(False)) from None
    finally:
        response.release()
    answer = await take_over(raw)
    if answer is not None:
        return answer
    headers = client_response_headers(response.headers)
    return web.Response(status=response.status, reason=response.reason, headers=headers, body=raw)


async def handle_messages(request: web.Request) -> web.StreamResponse:
    return await handle_conversation(request, MESSAGES)


async def handle_count_tokens(request: web.Request) -> web.StreamResponse:
    return await handle_conversation(request, COUNT_TOKENS)


async def handle_chat_completions(request: web.Request) -> web.StreamResponse:
    return await handle_conversation(request, CHAT_COMPLETIONS)
