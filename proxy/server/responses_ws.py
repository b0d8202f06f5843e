"""`GET /v1/responses` upgraded to a WebSocket: Codex's first choice, relayed and compacted.

One upstream socket per client socket (proxy/server/ws_pair.py: the upgrade, its headers
and refusals (426 when the upstream has no WebSocket), frames in order, close codes,
heartbeat, frame size and idle timeouts); `[responses] websocket = "refuse"` answers 426
without asking the upstream.

Each `response.create` is the exchange of an HTTP Responses request (proxy/server/
exchange.py, with proxy/server/responses.py `before` as its own step), over the socket's
transport (proxy/server/ws_transport.py): resolved to the whole request first against
what this socket saw (proxy/wire/responses_ws.py), counted, offloaded, folded, refused
when nothing fits, Codex's compaction_trigger served or passed through, the caller's
budgets reserved and settled per frame (its own Ticket), usage metered from the events;
upstream, only the new items go while the rewrite of the prefix is unchanged. A
rewritten request's read_result rounds are answered on the socket and merged into the
one response the client sees. Refusals are error frames `{"type": "error", "status": N,
"error": {...}}`, as the API sends them. Each frame is a request of its own for metrics
and the request log (method WS).

A frame of any other type passes to the upstream unchanged, and what comes back between
responses passes to the client unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from aiohttp import WSCloseCode, web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.core.errors import NotAuthenticated, ProxyError, UpgradeRequired
from proxy.core.errors import StoreUnavailable as CannotCheck
from proxy.server import record as records
from proxy.server.budgets import STORE_DOWN_RETRY_AFTER, TICKET, admission, budget_of
from proxy.server.caller import CALLER, caller_of, count_rejection
from proxy.server.errors import render
from proxy.server.exchange import Exchange
from proxy.server.fleet import FLEET
from proxy.server.logs import REQUEST_LOG
from proxy.server.metrics import METRICS, REQUEST_ENDED
from proxy.server.passthrough import handle_passthrough
from proxy.server.record import RequestRecord, new_record_id
from proxy.server.responses import RESPONSES_STATE
from proxy.server.state import COMPACTOR, SETTINGS, STORE
from proxy.server.traces import request_span
from proxy.server.ws_pair import HANDSHAKE, Gone, SocketPair
from proxy.server.ws_transport import FrameTransport, KeptResponses, relay_response
from proxy.store import StoreUnavailable
from proxy.wire.responses import RESPONSES
from proxy.wire.responses_units import input_items
from proxy.wire.responses_ws import (
    CREATE,
    error_frame,
    error_frame_of,
    is_error_frame,
    kept_after,
    parsed_frame,
    resolve,
)

log = logging.getLogger(__name__)

ROUTE = "/v1/responses"


def wants_websocket(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"


async def handle_responses_get(request: web.Request) -> web.StreamResponse:
    """GET /v1/responses: the WebSocket (relayed, or refused with 426), else passed through."""
    if not wants_websocket(request):
        return await handle_passthrough(request)
    metrics = request.app[METRICS]
    if request.app[SETTINGS].responses.websocket != "relay":
        metrics.websocket_sessions.labels("refused").inc()
        raise UpgradeRequired(
            "WebSocket connections to /v1/responses are not served by this compaction-proxy;"
            " use HTTP POST."
        )
    return await Relay(request, records.current()).serve()


class Relay(SocketPair):
    """One client socket, its upstream socket, and what each keeps of the last response."""

    def __init__(self, request: web.Request, upgrade: RequestRecord | None) -> None:
        super().__init__(request, upgrade)
        self.kept = KeptResponses()  # what each side keeps of the last response
        # What each frame is handled as: the upgrade request without its handshake
        # headers (the summariser's POSTs must not carry Sec-WebSocket-Key), the caller's.
        kept = [(n, v) for n, v in request.headers.items() if n.lower() not in HANDSHAKE]
        self.frames_request = request.clone(headers=CIMultiDictProxy(CIMultiDict(kept)))
        self.frames_request[CALLER] = caller_of(request)
        self.has_budgets = request.get(TICKET) is not None

    # -- one response.create --------------------------------------------------------------

    async def on_frame(self, text: str) -> bool:
        frame = parsed_frame(text)
        if frame is None or frame.get("type") != CREATE:
            return False  # not a request: the upstream's to answer
        await self._create(text, frame)
        return True

    async def _create(self, raw: str, frame: dict[str, Any]) -> None:
        record = RequestRecord(new_record_id(), ROUTE, "WS")
        record.reads_answers_as(RESPONSES)
        token = records.begin(record)
        status = 500
        # The frame's own SERVER span (a no-op with tracing off), a child of the upgrade's
        # traceparent: one trace per agent turn, as over HTTP.
        span = request_span(self.frames_request, record, route=ROUTE, transport="websocket")
        with span as outcome:
            try:
                async with self._ticket():
                    status = await self._drive(raw, frame, record)
            except ProxyError as error:
                status = error.status
                response = render(error, RESPONSES)
                body = response.body if isinstance(response.body, bytes) else b""
                await self.to_client(error_frame_of(error.status, body, response.headers))
            except asyncio.CancelledError:
                status = 200 if record.meter.complete else 499
                raise
            except Gone as gone:
                status = 200 if record.meter.complete else 499 if gone.side == "client" else 502
                raise
            except Exception:
                # A fault of the proxy's own mid-frame: the socket's state is unknown from
                # here, so the client is told and both sockets close (Codex opens a new one).
                log.exception("WebSocket frame failed; closing the socket")
                status = 500
                failure = {
                    "type": "api_error",
                    "message": "compaction-proxy failed on this request",
                }
                with contextlib.suppress(Exception):
                    await self.to_client(error_frame(500, failure))
                raise Gone("proxy", WSCloseCode.INTERNAL_ERROR, b"internal error") from None
            finally:
                outcome.status = status
                ended = time.perf_counter()
                records.end(token)
                self.metrics.record(record, status, ended)
                self.app[REQUEST_LOG].emit(record, status, ended)
                for listener in self.app.get(REQUEST_ENDED, ()):
                    listener(record, status)

    def _ticket(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """The frame's own budget ticket (reserve, then settle to its usage), when the
        caller has budgets."""
        request = self.frames_request
        if not self.has_budgets:
            return contextlib.nullcontext()
        ticket = admission(request, caller_of(request))  # meters the current (frame's) record
        request[TICKET] = ticket
        return ticket

    async def _key_still_good(self) -> None:
        """A proxy key checked at the upgrade is checked again for every frame (its
        record at most `auth.cache_seconds` old): a revoked key stops being served on a
        socket it opened before."""
        caller = caller_of(self.frames_request)
        if caller.key_id is None:
            return
        fleet = self.app[FLEET]
        accounts = fleet.accounts()
        try:
            if accounts is None:
                raise StoreUnavailable("no key store")
            found = await fleet.key_record(accounts, caller.key_id)
        except StoreUnavailable:
            count_rejection(self.app, "store_unavailable")
            raise CannotCheck(
                "compaction-proxy cannot check keys right now (its store is unreachable);"
                " retry shortly",
                retry_after=STORE_DOWN_RETRY_AFTER,
            ) from None
        if found is None or found.get("revoked") == "1":
            count_rejection(self.app, "key")
            raise NotAuthenticated("invalid x-api-key")

    async def _drive(self, raw: str, frame: dict[str, Any], record: RequestRecord) -> int:
        request = self.frames_request
        await self._key_still_good()
        kept = self.kept
        payload = resolve(kept.client, frame)
        if payload is None:
            # A response this socket does not keep: the upstream's to resolve or refuse.
            log.info("previous_response_id not kept on this socket; passed through")
            kept.client = kept.upstream = None
            record.sending()
            assert self.up is not None
            await self.up.send_str(raw)
            await relay_response(self, kept, record, None)
            return 200
        app, caller = self.app, caller_of(request)
        transport = FrameTransport(
            self, kept, record, raw, frame, payload, key_checks=caller.key_id is not None
        )
        exchange = Exchange(
            app[RESPONSES_STATE].route,
            transport,
            request,
            caller=caller,
            compactor=app[COMPACTOR],
            store=app[STORE].store,
            upstream=self.upstream,
            budget=budget_of(request),
            record=record,
        )
        end = await exchange.run()
        kept.client = kept_after(input_items(payload), end) if end is not None else None
        return _status_of(end)


def _status_of(end: dict[str, Any] | None) -> int:
    """A frame's status for metrics and the log: an error frame's, else 200."""
    if end is not None and is_error_frame(end):
        return int(end["status"])
    return 200
