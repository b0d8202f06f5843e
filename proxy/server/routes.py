"""The routes that carry a conversation: POST /v1/messages, /v1/messages/count_tokens,
/v1/chat/completions and /v1/responses, one request path for all of them.

    read the body ─► parse ─► the API's own step ─► prepare (compaction)
        ─► reserve (budgets) ─► forward
        ─► relay the answer as bytes, or answer read_result rounds (read_rounds.py)

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

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.core.calibration import calibrates
from proxy.core.errors import ExpectationFailed, InvalidRequest, UnsupportedEncoding
from proxy.core.identity import tenant_of
from proxy.core.policy import PolicyError
from proxy.core.wire_format import WireFormat
from proxy.server import budgets
from proxy.server.bodies import (
    BodyTooLarge,
    check_duplicates,
    check_model,
    decoded,
    is_encoded,
    output_tokens,
    read_body,
    too_large,
)
from proxy.server.caller import caller_of
from proxy.server.compactor import Prepared, calibrated_as
from proxy.server.errors import not_a_path, render, upstream_failure
from proxy.server.headers import client_response_headers, upstream_request_headers
from proxy.server.read_rounds import ReadRounds
from proxy.server.record import current_or_throwaway
from proxy.server.relay import relay
from proxy.server.routing import OPENAI_UPSTREAM
from proxy.server.state import COMPACTOR, SETTINGS, STORE, UPSTREAM
from proxy.server.upstream import Upstream
from proxy.wire import ANTHROPIC, CHAT

log = logging.getLogger(__name__)


Refused = Callable[[bytes], Awaitable[web.StreamResponse | None]]
DUPLICATES_OFF_LOOP_BYTES = 1024 * 1024


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


@dataclass(frozen=True, slots=True)
class Incoming:
    body: bytes  # as sent: what goes upstream unless compaction rewrites it
    payload: dict[str, Any] | None  # parsed (decoded first when encoded); None: uninspected
    encoded: bool = False  # sent with a Content-Encoding: inspected only, never rewritten


async def _read_payload(request: web.Request, route: ConversationRoute) -> Incoming:
    if request.raw_path[:1] != "/":
        raise not_a_path(request.raw_path)
    limit = request.app[SETTINGS].server.max_body_bytes
    try:
        body = await read_body(request, limit)
    except BodyTooLarge:
        raise too_large(limit) from None
    except asyncio.IncompleteReadError:
        raise InvalidRequest("The request body ended before its Content-Length.") from None
    # A body sent with a Content-Encoding is decoded to be read (bounded), and forwarded
    # as sent; one that cannot be decoded goes through uninspected, unless a budget
    # must read it.
    encoded = is_encoded(request)
    text = await decoded(request, body)
    if text is None:
        if budgets.applies(request):
            raise unreadable_encoding(request)
        return Incoming(body, None, encoded)
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        if encoded and not budgets.applies(request):
            return Incoming(body, None, encoded)
        raise InvalidRequest(f"{route.bad_json}: {e}") from None
    if not isinstance(parsed, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    check_model(parsed)
    if caller_of(request).key_id is not None:  # a proxy key's: the operator pays
        if len(text) > DUPLICATES_OFF_LOOP_BYTES:  # a pass over megabytes: off the loop
            await asyncio.to_thread(check_duplicates, text, parsed)
        else:
            check_duplicates(text, parsed)
    return Incoming(body, parsed, encoded)


def unreadable_encoding(request: web.Request) -> UnsupportedEncoding:
    coding = ", ".join(request.headers.getall("Content-Encoding", []))
    return UnsupportedEncoding(
        f"compaction-proxy cannot read a body sent with Content-Encoding: {coding}, and"
        " this key's budgets must: send it uncompressed, or gzip or deflate."
    )


def tenant_of_request(request: web.Request) -> str:
    """The tenant calibration and budgets are kept for: the key's, or the credential's."""
    return caller_of(request).tenant or tenant_of(request.headers)


async def _prepare(
    request: web.Request,
    route: ConversationRoute,
    incoming: Incoming,
    upstream_headers: Sequence[tuple[str, str]],
) -> Prepared:
    """What goes upstream. Never raises for the proxy's own parts: on any failure of
    compaction the request goes out untouched (degrade, never fail)."""
    body, payload = incoming.body, incoming.payload
    untouched = Prepared(body, payload, str((payload or {}).get("model", "")))
    if payload is None or not route.compacts or incoming.encoded:
        return untouched
    app = request.app
    caller = caller_of(request)
    override = caller.policy
    for attempt in (1, 2):
        try:
            return await app[COMPACTOR].prepare(
                body,
                payload,
                request.headers,
                wire=route.wire,
                store=app[STORE].store,
                upstream=app[route.upstream],
                path=request.raw_path,
                upstream_headers=upstream_headers,
                tenant=caller.tenant,
                policy_override=override,
                spend=budgets.summary_budget(request),
            )
        except PolicyError as e:
            # A key's or team's window/trigger/target that does not fit this model's
            # policy (`budgets set` checks it; the config may have changed since): the
            # model's own policy applies rather than none.
            if override is None or attempt == 2:
                log.exception("compaction failed; forwarding the request untouched")
                return untouched
            log.warning("the key's policy override does not fit this model (%s); ignored", e)
            override = None
        except Exception:
            log.exception("compaction failed; forwarding the request untouched")
            return untouched
    return untouched


async def _reserve(
    request: web.Request, route: ConversationRoute, prepared: Prepared, output: int
) -> None:
    if not route.compacts or not budgets.applies(request):
        return
    compactor = request.app[COMPACTOR]
    sent = prepared.sent
    assert sent is not None  # a body budgets cannot read was refused when read
    estimate = prepared.estimate
    if estimate == 0:  # not counted: the body's size proved it small; count it now
        estimate = (await compactor.count(route.wire, sent, len(prepared.body))).total
    model = calibrated_as(route.wire, str(sent.get("model", "")))
    factor = compactor.calibration.factor(model, None, tenant_of_request(request))
    calibrated = int(estimate * max(1.0, factor) + 0.999)
    await budgets.reserve(request, calibrated, output, prepared.body)


async def handle_conversation(request: web.Request, route: ConversationRoute) -> web.StreamResponse:
    record = current_or_throwaway()
    if route.compacts:
        record.reads_answers_as(route.wire)
    incoming = await _read_payload(request, route)
    body, payload = incoming.body, incoming.payload
    output = 0
    if payload is not None:
        record.model = str(payload.get("model", ""))[:128]
        if route.compacts and budgets.applies(request):
            output = output_tokens(payload)  # checked before any work is done for it
            # The gate: nothing that costs the upstream money before the budget says yes.
            await budgets.admit(request, output, body)
    adjusted, rewritten = None, False
    if route.before is not None and payload is not None:
        adjusted = await route.before(request, body, payload)
        if adjusted.answer is not None:
            return adjusted.answer
        rewritten = adjusted.body is not body
        if rewritten:  # the step wrote new bytes: plain JSON, whatever the client's were
            incoming = Incoming(adjusted.body, adjusted.payload)
        body, payload = incoming.body, incoming.payload
    headers = upstream_request_headers(request.headers)  # for the summariser and upstream
    prepared = await _prepare(request, route, incoming, headers)
    if prepared.refusal is not None:
        raise prepared.refusal
    if adjusted is not None and not adjusted.read_result:
        prepared.tool = None
    await _reserve(request, route, prepared, output)

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
    _calibrate(request, route.wire, prepared)
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


def _calibrate(request: web.Request, wire: WireFormat, prepared: Prepared) -> None:
    """Feed the tenant's calibration with what the upstream reported for the first round
    against the estimate of what was sent (not from requests with media blocks, whose
    estimate is a flat guess)."""
    if not prepared.sample or prepared.estimate <= 0 or not prepared.model:
        return
    first = current_or_throwaway().meter.first_round
    if first is None or first.total_input <= 0:
        return
    if prepared.sent is None or not calibrates(prepared.sent):
        return
    app = request.app
    app[COMPACTOR].calibration.record(
        calibrated_as(wire, prepared.model),
        prepared.estimate,
        first.total_input,
        app[STORE].store,
        tenant_of_request(request),
    )


async def handle_messages(request: web.Request) -> web.StreamResponse:
    return await handle_conversation(request, MESSAGES)


async def handle_count_tokens(request: web.Request) -> web.StreamResponse:
    return await handle_conversation(request, COUNT_TOKENS)


async def handle_chat_completions(request: web.Request) -> web.StreamResponse:
    return await handle_conversation(request, CHAT_COMPLETIONS)
