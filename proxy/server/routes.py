"""The routes that carry a conversation: POST /v1/messages, /v1/messages/count_tokens,
/v1/chat/completions and /v1/responses, one request path for all of them.

    read the body ─► parse ─► the API's own step ─► prepare (compaction)
        ─► reserve (budgets) ─► forward
        ─► relay the answer as bytes, or answer read_result rounds (read_rounds.py)

The API's own step (`ConversationRoute.before`, optional) sees the parsed request first:
it may answer it itself, change what is compacted and forwarded, keep read_result out of
it, or take over an upstream refusal (Responses: proxy/server/responses.py).

A request that fits goes out as its original bytes (DESIGN invariant 1); one over its
trigger goes out rewritten. Any failure of the proxy's own compaction parts forwards the
request untouched (invariant 7); refusals the API itself would give are raised as
`ProxyError`s and rendered in the route's shape (proxy/server/errors.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.core.errors import ExpectationFailed, InvalidRequest, RequestTooLarge
from proxy.core.wire_format import WireFormat
from proxy.server import budgets
from proxy.server.caller import caller_of
from proxy.server.compactor import Prepared
from proxy.server.errors import not_a_path, render, upstream_failure
from proxy.server.headers import client_response_headers, upstream_request_headers
from proxy.server.read_rounds import ReadRounds
from proxy.server.record import detached
from proxy.server.relay import relay
from proxy.server.routing import OPENAI_UPSTREAM
from proxy.server.state import COMPACTOR, SETTINGS, STORE, UPSTREAM
from proxy.server.upstream import Upstream
from proxy.wire import ANTHROPIC, CHAT

log = logging.getLogger(__name__)


Refused = Callable[[bytes], Awaitable[web.StreamResponse | None]]


@dataclass(slots=True)
class Adjusted:
    """What an API's own step made of a parsed request."""

    body: bytes  # what goes on to compaction and upstream
    payload: dict[str, Any]  # ... parsed
    answer: web.StreamResponse | None = None  # answered by the proxy: nothing is forwarded
    read_result: bool = True  # False: the proxy answers no read_result for this request
    # Given the body of an upstream 400 or 422, an answer to give instead (None: relay it).
    on_refusal: Refused | None = None


Before = Callable[[web.Request, bytes, dict[str, Any]], Awaitable[Adjusted]]


@dataclass(frozen=True, slots=True)
class ConversationRoute:
    """What differs between the routes that carry a conversation."""

    upstream: web.AppKey[Upstream]
    wire: WireFormat
    compacts: bool = True  # count_tokens only counts: nothing to rewrite or meter
    bad_json: str = "The request body is not valid JSON"
    before: Before | None = None  # the API's own step on the parsed request


MESSAGES = ConversationRoute(UPSTREAM, ANTHROPIC)
COUNT_TOKENS = ConversationRoute(UPSTREAM, ANTHROPIC, compacts=False)
CHAT_COMPLETIONS = ConversationRoute(
    OPENAI_UPSTREAM, CHAT, bad_json="We could not parse the JSON body of your request"
)


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


def _too_large(limit: int) -> RequestTooLarge:
    return RequestTooLarge(f"Request exceeds the maximum allowed number of bytes ({limit}).")


ExpectHandler = Callable[[web.Request], Awaitable[web.StreamResponse | None]]


def expect_for(route: ConversationRoute) -> ExpectHandler:
    async def expect_within_limit(request: web.Request) -> web.StreamResponse | None:
        """Answer `Expect: 100-continue`: go on only when the announced body fits, so a
        client with a body over the limit gets its 413 before uploading it."""
        limit = request.app[SETTINGS].server.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            return render(_too_large(limit), route.wire)
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


async def _read_payload(
    request: web.Request, route: ConversationRoute
) -> tuple[bytes, dict[str, Any] | None]:
    if request.raw_path[:1] != "/":
        raise not_a_path(request.raw_path)
    limit = request.app[SETTINGS].server.max_body_bytes
    try:
        body = await read_body(request, limit)
    except BodyTooLarge:
        raise _too_large(limit) from None
    except asyncio.IncompleteReadError:
        raise InvalidRequest("The request body ended before its Content-Length.") from None
    # A compressed body is forwarded as sent, uninspected (the server does not decompress).
    if request.headers.get("Content-Encoding", "identity").lower() != "identity":
        return body, None
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(f"{route.bad_json}: {e}") from None
    if not isinstance(parsed, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return body, parsed


async def _prepare(
    request: web.Request, route: ConversationRoute, body: bytes, payload: dict[str, Any] | None
) -> Prepared:
    """What goes upstream. Never raises for the proxy's own parts: on any failure of
    compaction the request goes out untouched (degrade, never fail)."""
    untouched = Prepared(body, payload)
    if payload is None or not route.compacts:
        return untouched
    app = request.app
    caller = caller_of(request)
    try:
        return await app[COMPACTOR].prepare(
            body,
            payload,
            request.headers,
            wire=route.wire,
            store=app[STORE].store,
            upstream=app[route.upstream],
            path=request.raw_path,
            upstream_headers=upstream_request_headers(request.headers),
            tenant=caller.tenant,
            policy_override=caller.policy,
            charge_later=budgets.late_charge(request),
        )
    except Exception:
        log.exception("compaction failed; forwarding the request untouched")
        return untouched


async def _reserve(request: web.Request, route: ConversationRoute, prepared: Prepared) -> None:
    if not route.compacts or not budgets.applies(request):
        return
    compactor = request.app[COMPACTOR]
    sent = prepared.sent
    estimate = prepared.estimate
    if sent is None:
        estimate = len(prepared.body) // 4  # unparsed (compressed): about 4 bytes a token
    elif estimate == 0:  # not counted: the body's size proved it small; count it now
        estimate = (await compactor.count(route.wire, sent, len(prepared.body))).total
    factor = compactor.calibration.factor(str((sent or {}).get("model", "")), None)
    calibrated = int(estimate * max(1.0, factor) + 0.999)
    max_output = route.wire.max_output(sent) if sent is not None else None
    await budgets.reserve(request, calibrated, max_output, prepared.body)


async def handle_conversation(request: web.Request, route: ConversationRoute) -> web.StreamResponse:
    record = detached()
    if route.compacts:
        record.reads_answers_as(route.wire)
    body, payload = await _read_payload(request, route)
    if payload is not None:
        record.model = str(payload.get("model", ""))[:128]
    adjusted = None
    if route.before is not None and payload is not None:
        adjusted = await route.before(request, body, payload)
        if adjusted.answer is not None:
            return adjusted.answer
        body, payload = adjusted.body, adjusted.payload
    prepared = await _prepare(request, route, body, payload)
    if prepared.refusal is not None:
        raise prepared.refusal
    if adjusted is not None and not adjusted.read_result:
        prepared.tool = None
    await _reserve(request, route, prepared)

    app = request.app
    upstream = app[route.upstream]
    headers = upstream_request_headers(request.headers)
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
        raise upstream_failure(e, upstream.base_url, upstream.timeout_for(stream)) from None
    record.answered(response.headers.get(route.wire.request_id_header, ""))

    if adjusted is not None and adjusted.on_refusal is not None and response.status in (400, 422):
        return await _refusal(response, adjusted.on_refusal)
    if prepared.intercepts:
        rounds = ReadRounds(request, prepared, route.wire, upstream, headers)
        out = await rounds.answer(response)
    else:
        out = await relay(
            request,
            response,
            prepared.headers,
            base_url=upstream.base_url,
            read_timeout=upstream.timeout_for(stream),
            wire=route.wire,
        )
    _calibrate(request, prepared)
    return out


async def _refusal(response: aiohttp.ClientResponse, take_over: Refused) -> web.StreamResponse:
    """An upstream refusal the API's own step may answer instead; else relayed as it came."""
    try:
        raw = await response.read()
    finally:
        response.release()
    answer = await take_over(raw)
    if answer is not None:
        return answer
    headers = client_response_headers(response.headers)
    return web.Response(status=response.status, reason=response.reason, headers=headers, body=raw)


def _calibrate(request: web.Request, prepared: Prepared) -> None:
    """Feed calibration with what the upstream reported for the first round against
    the estimate of what was sent."""
    if not prepared.sample or prepared.estimate <= 0 or not prepared.model:
        return
    first = detached().meter.first_round
    if first is None or first.total_input <= 0:
        return
    app = request.app
    app[COMPACTOR].calibration.record(
        prepared.model, prepared.estimate, first.total_input, app[STORE].store
    )


async def handle_messages(request: web.Request) -> web.StreamResponse:
    return await handle_conversation(request, MESSAGES)


async def handle_count_tokens(request: web.Request) -> web.StreamResponse:
    return await handle_conversation(request, COUNT_TOKENS)


async def handle_chat_completions(request: web.Request) -> web.StreamResponse:
    return await handle_conversation(request, CHAT_COMPLETIONS)
