"""The pipeline of one conversation request, the steps every route that carries a
conversation runs: Messages and Chat (proxy/server/routes.py), Responses over HTTP (the
same, with its own step: proxy/server/responses.py) and each `response.create` frame of a
Responses WebSocket (proxy/server/responses_ws.py).

    read ─► admit (the gate) ─► [the API's own step] ─► prepare (compaction)
        ─► reserve (budgets) ─► forward and answer ─► calibrate

- `read`: the body within its limit and time (proxy/server/bodies.py), decoded to be read
  when compressed (never rewritten), parsed, its model name and duplicate fields checked;
- `admit`: with budgets, the caller's output cap is checked and the gate passed before
  anything costs the upstream money;
- `prepare`: the compactor's rewrite, or the request untouched on any failure of the
  proxy's own parts (DESIGN invariant 7); whether read_result may be offered rides on
  `Incoming.read_result` (the API's own step decides it, before the planner);
- `reserve`: the calibrated estimate of what is sent, and the output, held in budgets;
- `calibrate`: the first round's reported usage against the estimate.

What differs between routes is a `ConversationRoute`; what an API's own step made of a
request is an `Adjusted`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from proxy.core.calibration import calibrates
from proxy.core.errors import InvalidRequest, UnsupportedEncoding
from proxy.core.identity import header_id, tenant_of
from proxy.core.policy import PolicyError
from proxy.core.reuse import Seen, key_of
from proxy.core.wire_format import WireFormat
from proxy.server import budgets
from proxy.server.bodies import (
    BodyTooLarge,
    check_duplicates,
    check_model,
    codings_of,
    decoded,
    output_tokens,
    read_body,
    too_large,
)
from proxy.server.caller import caller_of
from proxy.server.compactor import Prepared, calibrated_as, factor_of
from proxy.server.errors import not_a_path
from proxy.server.record import current_or_throwaway
from proxy.server.state import COMPACTOR, SETTINGS, STORE
from proxy.server.upstream import Upstream

log = logging.getLogger(__name__)


Refused = Callable[[bytes], Awaitable[web.StreamResponse | None]]

DUPLICATES_OFF_LOOP_BYTES = 1024 * 1024


@dataclass(slots=True)
class Adjusted:
    """What an API's own step made of a parsed request."""

    body: bytes  # what goes on to compaction and upstream
    payload: dict[str, Any]  # ... parsed
    answer: web.StreamResponse | None = None  # answered by the proxy: nothing is forwarded
    # False: the proxy answers no read_result for this request, and the planner is told so
    # before it writes any stub (the one place this is decided).
    read_result: bool = True
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


@dataclass(frozen=True, slots=True)
class Incoming:
    """A request as read (step 1), and what its API's own step said of it."""

    body: bytes  # as sent: what goes upstream unless compaction rewrites it
    payload: dict[str, Any] | None  # parsed (decoded first when encoded); None: uninspected
    encoded: bool = False  # sent with a Content-Encoding: inspected only, never rewritten
    # False: no read_result for this request (`Adjusted.read_result`): the one decision,
    # made before the planner, which then writes no stub naming it.
    read_result: bool = True
    # What was computed for its conversation line's last request (proxy/core/reuse.py).
    seen: Seen | None = None


async def read(request: web.Request, route: ConversationRoute) -> Incoming:
    """Step 1: the body, read within its limit and time, decoded and parsed when it can be;
    its model name and (for a proxy key) its duplicate fields checked."""
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
    codings = codings_of(request)  # read once: whether encoded, and how to decode
    encoded = bool(codings)
    text = await decoded(request, body, codings)
    if text is None:
        if budgets.applies(request):
            raise unreadable_encoding(request)
        return Incoming(body, None, encoded)
    try:
        parsed, seen = _parsed(request, route, text)
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
    return Incoming(body, parsed, encoded, seen=seen)


def _parsed(request: web.Request, route: ConversationRoute, text: bytes) -> tuple[Any, Seen | None]:
    """The body parsed: as the continuation of its conversation line's last request when
    it repeats its bytes (proxy/core/reuse.py: only what is new is parsed)."""
    if not route.compacts:
        return orjson.loads(text), None
    key = key_of(tenant_of_request(request), header_id(request.headers), text)
    return request.app[COMPACTOR].reuse.parse(key, text, route.wire.history_field)


def unreadable_encoding(request: web.Request) -> UnsupportedEncoding:
    coding = ", ".join(request.headers.getall("Content-Encoding", []))
    return UnsupportedEncoding(
        f"compaction-proxy cannot read a body sent with Content-Encoding: {coding}, and"
        " this key's budgets must: send it uncompressed, or gzip or deflate."
    )


def tenant_of_request(request: web.Request) -> str:
    """The tenant calibration and budgets are kept for: the key's, or the credential's."""
    return caller_of(request).tenant or tenant_of(request.headers)


async def admit(
    request: web.Request, route: ConversationRoute, payload: dict[str, Any], body: bytes
) -> int:
    """Step 2, the gate: nothing that costs the upstream money (a summary made for this
    request) before the caller's budgets say yes. The output the request may generate
    (its largest cap times its choices; 0 without budgets), which `reserve` holds."""
    if not route.compacts or not budgets.applies(request):
        return 0
    output = output_tokens(payload)  # checked before any work is done for it
    await budgets.admit(request, output, body)
    return output


async def prepare(
    request: web.Request,
    route: ConversationRoute,
    incoming: Incoming,
    upstream_headers: Sequence[tuple[str, str]],
) -> Prepared:
    """Step 3: what goes upstream (compaction). Never raises for the proxy's own parts:
    on any failure of compaction the request goes out untouched (degrade, never fail)."""
    body, payload = incoming.body, incoming.payload
    if payload is None or not route.compacts or incoming.encoded:
        return _untouched(incoming)
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
                read_result=incoming.read_result,
                seen=incoming.seen,
            )
        except PolicyError as e:
            # A key's or team's window/trigger/target that does not fit this model's
            # policy (`budgets set` checks it; the config may have changed since): the
            # model's own policy applies rather than none.
            if override is None or attempt == 2:
                log.exception("compaction failed; forwarding the request untouched")
                return _untouched(incoming)
            log.warning("the key's policy override does not fit this model (%s); ignored", e)
            override = None
        except Exception:
            log.exception("compaction failed; forwarding the request untouched")
            return _untouched(incoming)
    return _untouched(incoming)


def _untouched(incoming: Incoming) -> Prepared:
    """The request as it came (made only when needed: a Prepared's default policy is
    built for it)."""
    payload = incoming.payload
    return Prepared(incoming.body, payload, str((payload or {}).get("model", "")))


async def reserve(
    request: web.Request, route: ConversationRoute, prepared: Prepared, output: int
) -> None:
    """Step 4: reserve what is sent (its estimate, calibrated) and its output cap in the
    caller's budgets, before anything goes upstream."""
    if not route.compacts or not budgets.applies(request):
        return
    compactor = request.app[COMPACTOR]
    sent = prepared.sent
    assert sent is not None  # a body budgets cannot read was refused when read
    estimate = prepared.estimate
    if estimate == 0:  # not counted: the body's size proved it small; count it now
        estimate = (
            await compactor.count(route.wire, sent, len(prepared.body), digests=False)
        ).total
    factor = factor_of(compactor.calibration, route.wire, prepared, tenant_of_request(request))
    calibrated = int(estimate * max(1.0, factor) + 0.999)
    await budgets.reserve(request, calibrated, output, prepared.body)


def calibrate(request: web.Request, wire: WireFormat, prepared: Prepared) -> None:
    """Step 5, after the answer: feed the tenant's calibration with what the upstream
    reported for the first round against the estimate of what was sent (not from requests
    with media blocks, whose estimate is a flat guess)."""
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
