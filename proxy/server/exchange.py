"""One conversation request, from its body to its answer: the exchange.

Every route that carries a conversation (Messages, Chat Completions and Responses over
HTTP, proxy/server/routes.py; each `response.create` frame of a Responses WebSocket,
proxy/server/responses_ws.py) builds one `Exchange` per request, with what it depends on
given in (the store, the compactor, the upstream, the caller's budget, the request's
record), and runs it. The steps, in order, are this module's alone:

    read ─► admit (the gate) ─► [the API's own step] ─► prepare (compaction)
        ─► reserve (budgets) ─► send ─► answer (relayed, or read rounds merged)
        ─► calibrate

- read: the transport's (an HTTP body within its limit and time, decoded and parsed, its
  model name and a proxy key's duplicate fields checked; a frame, resolved);
- admit: with budgets, the output cap checked and the gate passed before anything costs
  the upstream money (docs/design.md#the-gate-first);
- the API's own step (`ConversationRoute.before`, optional), given the exchange (its
  request and what it depends on), sees the parsed request: it may answer it itself,
  change what is compacted and forwarded, keep read_result out of it, or take over an
  upstream refusal (Responses: proxy/server/responses.py);
- prepare: the compactor's rewrite, or the request untouched on any failure of the
  proxy's own parts (degrade, never fail); a request that fits goes out as its bytes;
- reserve: the calibrated estimate of what is sent, and its output cap, held;
- send and answer: through the transport (proxy/server/transport.py): relayed as it
  comes, or, when read_result was injected, the read rounds' generator (proxy/core/
  rounds.py) driven with the transport sending each round and the format's merger
  deciding what the client sees (proxy/server/read_rounds.py);
- calibrate: the first round's reported usage against the estimate.

What differs between routes is a `ConversationRoute` (its wire format, upstream,
envelope and own step); between transports, the `Transport`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from aiohttp import web

from proxy.core.calibration import answer_sample
from proxy.core.identity import tenant_of
from proxy.core.rounds import read_rounds
from proxy.core.wire_format import WireFormat
from proxy.server.bodies import BAD_JSON, Incoming, output_tokens
from proxy.server.budgets import Budget
from proxy.server.calibration import calibrated_as
from proxy.server.caller import Caller
from proxy.server.compactor import Asked, Compactor
from proxy.server.driving import drive
from proxy.server.envelope import PLAIN, Envelope
from proxy.server.prepared import Prepared
from proxy.server.read_rounds import RoundExecutor
from proxy.server.record import RequestRecord
from proxy.server.summariser import SummaryCalls
from proxy.server.transport import (
    Codecs,
    MergedHeaders,
    Outgoing,
    Refused,
    Transport,
    codec_for,
)
from proxy.server.upstream import Upstream
from proxy.store import Store

A = TypeVar("A")
log = logging.getLogger(__name__)

ENDINGS = {  # how read rounds may end early, as the log says it
    "window": "read_result round would not fit the window; ending the answer",
    "budget": "read_result round refused by a budget; ending the answer",
}


@dataclass(frozen=True, slots=True)
class Adjusted:
    """What an API's own step made of a parsed request."""

    body: bytes  # what goes on to compaction and upstream
    payload: dict[str, Any]  # ... parsed
    answer: web.StreamResponse | None = None  # answered by the proxy: nothing is forwarded
    # False: the proxy answers no read_result for this request, and the planner is told so
    # before it writes any stub naming it (the one place this is decided).
    read_result: bool = True
    on_refusal: Refused | None = None  # may answer an upstream 400/422 instead


# An API's own step: given the exchange (its request and what it depends on), the body
# and its parsed payload.
Before = Callable[["Exchange[Any]", bytes, dict[str, Any]], Awaitable[Adjusted]]


@dataclass(frozen=True, slots=True)
class ConversationRoute:
    """What differs between the routes that carry a conversation."""

    upstream: web.AppKey[Upstream] | None  # None: its handler picks one per request
    wire: WireFormat
    compacts: bool = True  # count_tokens only counts: nothing to rewrite or meter
    bad_json: str = BAD_JSON
    before: Before | None = None  # the API's own step on the parsed request
    envelope: Envelope = PLAIN  # where the model, betas and stream flag are carried
    # An HTTP answer's Content-Type to its stream framing (None: a whole answer); a
    # route whose streams the Content-Type does not tell gives its own.
    codecs: Codecs = codec_for
    merged_headers: MergedHeaders | None = None  # a merged whole answer's, made true


class Exchange(Generic[A]):
    """One request's exchange over `transport`, whose answer (`A`) it returns.
    `request` is the one it answers (its path and headers: a WebSocket's frames are
    answered as its upgrade request)."""

    def __init__(
        self,
        route: ConversationRoute,
        transport: Transport[A],
        request: web.Request,
        *,
        caller: Caller,
        compactor: Compactor,
        store: Store | None,
        upstream: Upstream,
        budget: Budget,
        record: RequestRecord,
    ) -> None:
        self.route = route
        self.transport = transport
        self.request = request
        self.caller = caller
        self.compactor = compactor
        self.store = store
        self.upstream = upstream
        self.budget = budget
        self.record = record

    @property
    def tenant(self) -> str:
        """Whose state this is: the key's tenant, or the hash of the caller's credential."""
        return self.caller.tenant or tenant_of(self.request.headers)

    async def run(self) -> A:
        """The exchange; a summary it has made ahead goes up once its answer starts (or
        once it ends without one), so that summary's call, reading the conversation's
        prefix, finds it in the provider's cache written by this request."""
        started = asyncio.Event()
        self.record.on_answer = started.set
        try:
            return await self._run(started)
        finally:
            self.record.on_answer = None
            started.set()

    async def _run(self, started: asyncio.Event) -> A:
        route, transport, record, budget = self.route, self.transport, self.record, self.budget
        wire, envelope, compactor = route.wire, route.envelope, self.compactor
        metered = route.compacts and budget.applies
        path = self.request.raw_path
        if route.compacts:
            record.reads_answers_as(wire)
        incoming = read = await transport.read()
        payload = incoming.payload
        model, output, on_refusal = "", 0, None
        if payload is not None:
            model = envelope.model(path, payload)
            record.model = model[:128]
            if metered:
                output = output_tokens(payload)  # checked before any work is done for it
                await budget.admit(output, incoming.body)
            if route.before is not None:
                adjusted = await route.before(self, incoming.body, payload)
                if adjusted.answer is not None:
                    return await transport.answer(adjusted.answer)
                # New bytes from the step are plain JSON, whatever the client's were.
                encoded = incoming.encoded and adjusted.body is incoming.body
                # (What the reuse cache kept of the line stays only with the same body.)
                seen = incoming.seen if adjusted.payload is incoming.payload else None
                incoming = Incoming(
                    adjusted.body, adjusted.payload, encoded, adjusted.read_result, seen
                )
                on_refusal = adjusted.on_refusal
        if route.compacts and incoming.payload is not None:
            headers, caller = self.request.headers, self.caller
            relisted = functools.partial(compactor.deferral_refused, self.upstream.shown_url, model)
            summarise = SummaryCalls(
                self.upstream,
                path,
                headers,
                wire,
                envelope,
                compactor.summariser.timeout,
                relisted=relisted,
            )
            betas = envelope.betas(headers, incoming.payload)
            asked = Asked(
                headers,
                model,
                betas,
                caller.tenant,
                caller.policy,
                budget.summaries(),
                summarise,
                answer_started=started,
                upstream=self.upstream.shown_url,
            )
            prepared = await compactor.prepare(incoming, wire, self.store, asked, record)
        else:
            prepared = Prepared(incoming.body, incoming.payload, model)
        if prepared.refusal is not None:
            raise prepared.refusal
        if metered:
            reserved = await compactor.reservation(wire, prepared)
            await budget.reserve(reserved, output, prepared.body)
        outgoing = Outgoing(
            prepared.body,
            prepared.sent,
            prepared.headers,
            rewritten=prepared.body is not read.body,
            # Unread, a body errs towards the stream (idle) timeout.
            stream=(
                envelope.stream(path, incoming.payload)
                if incoming.payload is not None
                else b'"stream"' in incoming.body
            ),
            tool=prepared.tool,
            on_refusal=on_refusal,
            relists=prepared.rounds is not None and prepared.rounds.relist is not None,
        )
        record.sending()
        if prepared.rounds is None:
            answer = await transport.relay(outgoing)
        else:
            merging = transport.merging(outgoing)
            executor = RoundExecutor(
                self.store,
                prepared.tenant,
                prepared.conversation,
                send=merging.round,
                top_up=budget.top_up,
                record=record,
            )
            began = time.perf_counter()
            try:
                ended = await drive(read_rounds(prepared.rounds), executor)
            finally:  # the time outside the transport's sending is the proxy's own
                record.interception_seconds += time.perf_counter() - began - executor.sending
            record.read_outcome = ended.outcome  # the log line's and the metric's
            if ended.relisted:  # later requests there go listed at once
                compactor.deferral_refused(self.upstream.shown_url, prepared.model)
            if ended.outcome in ENDINGS:
                log.info(ENDINGS[ended.outcome])
            answer = await merging.finish(ended)
        # calibrate: the first round's reported usage against the estimate of what was
        # sent, when the compactor asked for this request's sample
        first = record.meter.first_round
        if prepared.sample and prepared.model and first is not None:
            ratio = answer_sample(prepared.estimate, first.total_input, prepared.sent)
            if ratio is not None:
                calibrated = calibrated_as(wire, prepared.model)
                compactor.calibration.record(calibrated, ratio, self.store, prepared.tenant)
        return answer
