"""`/v1/responses`: what the Responses route does beyond the shared request path.

POST goes through proxy/server/routes.py like the other conversation routes, with this
route's own step first (`before`):

- a `compaction` item the proxy sealed earlier is replaced by its summary (or by a note
  when it does not open: another tenant's, or its summary gone), so the upstream never
  sees it and the planner counts what the model will read;
- a request that asks for a summary (Codex's `compaction_trigger`, or a request with
  `tools: []` like Codex's handoff-summary request) is compacted like any other but gets
  no read_result: nothing of its answer is held back, and the planner, told so first,
  writes no stub naming it (`Adjusted.read_result`, proxy/server/exchange.py);
- Codex's `compaction_trigger` is forwarded, or answered by the proxy itself, as
  `[responses] codex_compaction` says: `pass-through`, `serve`, or `auto` (forward it;
  once the upstream refuses one, as a server that is not OpenAI does, serve them). The
  proxy's answer is one `compaction` item whose `encrypted_content` is a sealed,
  tenant-bound reference (proxy/core/seal.py) to a summary of the history stored for the
  conversation.

GET (a WebSocket, Codex's first choice, or a plain one): proxy/server/responses_ws.py,
which runs each `response.create` frame as an exchange (proxy/server/exchange.py), with
`before` as its own step.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.core.commands import GetSummary, SummaryReply
from proxy.core.counting import count_tokens
from proxy.core.errors import StoreUnavailable, UpstreamError
from proxy.core.exact_json import ClientJSON
from proxy.core.identity import identities
from proxy.core.seal import open_sealed, seal
from proxy.core.summariser_input import whole_key, whole_summary
from proxy.core.summary import INSTRUCTION, in_place_prompt
from proxy.server.bodies import Incoming, is_encoded
from proxy.server.compactor import Asked, Compactor
from proxy.server.envelope import PLAIN
from proxy.server.errors import new_request_id
from proxy.server.exchange import Adjusted, ConversationRoute, Exchange
from proxy.server.executor import StoreExecutor
from proxy.server.prepared import Prepared
from proxy.server.record import RequestRecord
from proxy.server.routes import expect_for, handle_conversation
from proxy.server.routing import OPENAI_UPSTREAM
from proxy.server.seal_key import SealKey
from proxy.server.summariser import FREE_SUMMARIES, SummaryCall, SummaryCalls
from proxy.store import Store
from proxy.wire.responses import RESPONSES, asks_for_summary
from proxy.wire.responses_compaction import (
    compaction_events,
    compaction_item,
    compaction_response,
    compaction_usage,
    expanded,
    fitted,
    is_trigger,
    sealed_items,
)
from proxy.wire.responses_units import flatten, heads_of, input_items

log = logging.getLogger(__name__)

SERVED_HEADER = "x-compaction-codex-compaction"


@dataclass
class ResponsesState:
    """What the Responses route keeps for the app's lifetime; its handlers run `route`,
    whose own step (`before`) is given this state."""

    codex_compaction: str = "auto"  # [responses] codex_compaction
    seal_key: SealKey = field(default_factory=SealKey)
    lacking: set[str] = field(default_factory=set)  # upstreams that refused a compaction_trigger
    route: ConversationRoute = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.route = ConversationRoute(
            OPENAI_UPSTREAM,
            RESPONSES,
            bad_json=BAD_JSON,
            before=functools.partial(before, self),
        )


RESPONSES_STATE = web.AppKey("responses_state", ResponsesState)
BAD_JSON = "We could not parse the JSON body of your request"


async def before(
    state: ResponsesState, exchange: Exchange[Any], body: bytes, payload: dict[str, Any]
) -> Adjusted:
    request = exchange.request
    if b'"cpx1.' in body or is_encoded(request):  # (compressed bytes hide the mark)
        found = sealed_items(payload)
        if found:
            opened = await _expand(state, exchange, payload, found)
            # The rest of the request as the client wrote it (compressed: as parsed).
            source = None if is_encoded(request) else ClientJSON(body, payload)
            body = source.encode(opened) if source is not None else orjson.dumps(opened)
            payload = opened
    if is_trigger(payload):
        return await _trigger(state, exchange, body, payload)
    if asks_for_summary(payload):
        return Adjusted(body, payload, read_result=False)
    return Adjusted(body, payload)


expect_responses = expect_for(ConversationRoute(OPENAI_UPSTREAM, RESPONSES))


async def handle_responses(request: web.Request) -> web.StreamResponse:
    return await handle_conversation(request, request.app[RESPONSES_STATE].route)


# -- sealed compaction items --------------------------------------------------------------


async def _expand(
    state: ResponsesState,
    exchange: Exchange[Any],
    payload: dict[str, Any],
    found: list[tuple[int, str]],
) -> dict[str, Any]:
    store = exchange.store
    key = await state.seal_key.get(store)
    tenant = exchange.tenant
    texts = {n: await _summary_text(store, key, tenant, content) for n, content in found}
    missing = sum(1 for text in texts.values() if text is None)
    if missing:
        log.info("%d sealed compaction item(s) did not open; a note stands in", missing)
    return expanded(payload, texts)


async def _summary_text(
    store: Store | None, key: bytes | None, tenant: str, content: str
) -> str | None:
    """The summary a sealed reference names, for this tenant; None: missing or not
    theirs (the same answer either way)."""
    if store is None or key is None:
        return None
    reference = open_sealed(key, tenant, content)
    conversation = reference.get("c") if reference else None
    name = reference.get("k") if reference else None
    if not isinstance(conversation, str) or not isinstance(name, str):
        return None
    try:
        text = await store.get_json(tenant, conversation, "summary", name)
        if isinstance(text, str):  # named again: it lives on
            await store.refresh_ttl(tenant, conversation, "summary", [name])
    except (StoreUnavailable, ValueError):
        return None
    return text if isinstance(text, str) and text.strip() else None


# -- Codex's compaction_trigger -----------------------------------------------------------


async def _trigger(
    state: ResponsesState, exchange: Exchange[Any], body: bytes, payload: dict[str, Any]
) -> Adjusted:
    mode = state.codex_compaction
    upstream = exchange.upstream.base_url
    if mode == "serve" or (mode == "auto" and upstream in state.lacking):
        answer = await serve_compaction(state, exchange, payload)
        return Adjusted(body, payload, answer=answer)
    if mode != "auto":
        return Adjusted(body, payload, read_result=False)

    async def refused(raw: bytes) -> web.StreamResponse | None:
        last = len(input_items(payload)) - 1
        if b"compaction_trigger" not in raw and f"input[{last}]".encode() not in raw:
            return None  # refused for another reason: the client gets that answer
        state.lacking.add(upstream)
        log.info("the upstream does not know compaction_trigger; the proxy serves them")
        return await serve_compaction(state, exchange, payload)

    return Adjusted(body, payload, read_result=False, on_refusal=refused)


async def _summary(
    compactor: Compactor,
    need: GetSummary,
    store: Store,
    tenant: str,
    conversation: str,
    call: SummaryCall,
    record: RequestRecord,
) -> SummaryReply:
    """The conversation's summary for `need`: the stored one, or made once for the fleet
    and stored before a sealed reference names it."""
    # The executor's own way with a summary: obtained (its lock held), kept, then the
    # lock released (a crossing keeps it in its writes; a served one, alone: keep_summary).
    executor = StoreExecutor(
        store,
        lambda: (tenant, conversation),
        summariser=compactor.summariser,
        summarise=call,
        background=compactor.spawn,
        count=compactor.counter.count_text,
        spend=FREE_SUMMARIES,
        on_background_call=compactor.on_background_summary,
        record=record,
    )
    try:
        reply = await executor(need)
        assert isinstance(reply, SummaryReply)
        if reply.text is not None and not reply.reused:  # made now: stored before named
            await executor.keep_summary(need.key, reply.text)
    except StoreUnavailable as e:
        raise StoreUnavailable("compaction-proxy could not keep the summary; try again") from e
    finally:
        await executor.close()
    return reply


def _summary_need(
    exchange: Exchange[Any], sent: dict[str, Any], model: str, prepared: Prepared
) -> tuple[GetSummary, int]:
    """The summariser's request for the whole history as sent, and its input estimate: in
    place or a transcript cut to the window, as the planner says (`whole_summary`)."""
    compactor = exchange.compactor
    policy = compactor.policy(model, exchange.caller.policy)
    counter = compactor.counter
    units = RESPONSES.messages(sent)
    key = whole_key(units)
    whole = whole_summary(
        policy, prepared.factor, model, lambda: count_tokens(RESPONSES, counter, sent, units).total
    )
    summary_tokens = whole.summary_tokens
    if whole.in_place:
        prompt = in_place_prompt(1, len(flatten(units)), heads_of(units), "")
        body = RESPONSES.summary_request(
            sent, model=model, summary_tokens=summary_tokens, prompt=prompt, history=units
        )
        if body is not None:
            return GetSummary(key, body, summary_tokens, model), whole.in_place
    instruction = counter.count_text(INSTRUCTION)
    transcript = RESPONSES.render_transcript(units)
    transcript = fitted(
        transcript, counter.count_text(transcript), whole.transcript_budget(instruction)
    )
    body = RESPONSES.summary_request(
        sent, model=whole.model, summary_tokens=summary_tokens, prompt=transcript, history=None
    )
    assert body is not None
    estimate = instruction + counter.count_text(transcript)
    return GetSummary(key, body, summary_tokens, whole.model), estimate


async def serve_compaction(
    state: ResponsesState, exchange: Exchange[Any], payload: dict[str, Any]
) -> web.Response:
    """Answer a compaction_trigger with one compaction item sealing a reference to the
    proxy's own summary of the history (compacted first, as a turn would be)."""
    request, store = exchange.request, exchange.store
    seal_key = await state.seal_key.get(store)
    if store is None or seal_key is None:
        raise StoreUnavailable("compaction-proxy cannot compact without its store; try again")
    history = {**payload, "input": input_items(payload)[:-1]}
    incoming = Incoming(orjson.dumps(history), history)
    budget, compactor, record = exchange.budget, exchange.compactor, exchange.record
    caller, model = exchange.caller, str(payload.get("model", ""))
    summarise = SummaryCalls(
        exchange.upstream,
        request.raw_path,
        request.headers,
        RESPONSES,
        PLAIN,
        compactor.summariser.timeout,
    )
    asked = Asked(
        request.headers, model, "", caller.tenant, caller.policy, budget.summaries(), summarise
    )
    prepared = await compactor.prepare(incoming, RESPONSES, store, asked, record)
    sent = dict(prepared.sent) if prepared.sent and prepared.refusal is None else history
    need, estimate = _summary_need(exchange, sent, model, prepared)
    await budget.reserve(estimate, need.summary_tokens, b"")
    tenant, conversation = identities(RESPONSES, payload, request.headers, exchange.tenant)
    made = len(record.meter.extra)
    reply = await _summary(compactor, need, store, tenant, conversation, asked.summarise, record)
    if reply.text is None:
        raise UpstreamError(f"compaction-proxy could not summarise the history ({reply.failure})")
    record.summary = "reused" if reply.reused else "made"
    sealed = seal(seal_key, tenant, {"c": conversation, "k": need.key})
    if len(record.meter.extra) > made:  # the summariser's own figures
        used = record.meter.extra[-1]
        usage = compaction_usage(used.total_input, used.output_tokens)
    else:
        usage = compaction_usage(estimate, compactor.counter.count_text(reply.text))
    response = compaction_response(payload, compaction_item(sealed), usage, int(time.time()))
    headers = {
        RESPONSES.request_id_header: new_request_id(),
        SERVED_HEADER: "served",
        "x-compaction-summary": record.summary,
    }
    if payload.get("stream") is True:
        return web.Response(
            body=compaction_events(response), content_type="text/event-stream", headers=headers
        )
    return web.Response(
        body=orjson.dumps(response), content_type="application/json", headers=headers
    )
