"""`GET /v1/responses` upgraded to a WebSocket: Codex's first choice, relayed and compacted.

One upstream socket per client socket (proxy/server/ws_pair.py: the upgrade, its headers
and refusals (426 when the upstream has no WebSocket), frames in order, close codes,
heartbeat, frame size and idle timeouts); `[responses] websocket = "refuse"` answers 426
without asking the upstream.

Each `response.create` goes through the pipeline of an HTTP Responses request
(proxy/server/pipeline.py `admit`, `prepare`, `reserve` and `calibrate`, with
proxy/server/responses.py `before` as its own step): resolved to the
whole request first against what this socket saw (proxy/wire/responses_ws.py), counted,
offloaded, folded, refused when nothing fits, Codex's compaction_trigger served or passed
through, the caller's budgets reserved and settled per frame (its own Ticket), usage
metered from the events; upstream, only the new items go while the rewrite of the prefix
is unchanged. A rewritten request's read_result rounds are answered on the socket (the
read rounds' generator, proxy/core/rounds.py, with the socket as its transport) and
merged into the one response the client sees (the Responses stream merger). Refusals are
error frames `{"type": "error", "status": N, "error": {...}}`, as the API sends them. Each
frame is a request of its own for metrics and the request log (method WS).

A frame of any other type passes to the upstream unchanged, and what comes back between
responses passes to the client unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import orjson
from aiohttp import WSCloseCode, WSMsgType, web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.core.commands import Answered, Failed, SendRound
from proxy.core.errors import NotAuthenticated, ProxyError, UpgradeRequired
from proxy.core.errors import StoreUnavailable as CannotCheck
from proxy.core.usage import Usage
from proxy.server import record as records
from proxy.server.bodies import check_duplicates
from proxy.server.budgets import STORE_DOWN_RETRY_AFTER, TICKET, Ticket
from proxy.server.caller import CALLER, caller_of, count_rejection
from proxy.server.compactor import Prepared
from proxy.server.errors import render
from proxy.server.fleet import FLEET
from proxy.server.logs import REQUEST_LOG
from proxy.server.metrics import METRICS, REQUEST_ENDED
from proxy.server.passthrough import handle_passthrough
from proxy.server.pipeline import Incoming, admit, calibrate, prepare, reserve
from proxy.server.read_rounds import ReadRounds
from proxy.server.record import RequestRecord, new_record_id
from proxy.server.responses import RESPONSES_ROUTE, before
from proxy.server.state import SETTINGS
from proxy.server.traces import request_span
from proxy.server.ws_pair import HANDSHAKE, Gone, SocketPair, send_message
from proxy.store import StoreUnavailable
from proxy.wire.responses import RESPONSES
from proxy.wire.responses_ws import (
    CREATE,
    Kept,
    as_event,
    ends_response,
    error_frame,
    error_frame_of,
    frame_of,
    frames_of_sse,
    input_list,
    is_error_frame,
    kept_after,
    resolve,
    upstream_frame,
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
    return await Relay(request).serve()


class Relay(SocketPair):
    """One client socket, its upstream socket, and what each keeps of the last response."""

    def __init__(self, request: web.Request) -> None:
        super().__init__(request)
        self.client_kept: Kept | None = None  # what the client may name next
        self.upstream_kept: Kept | None = None  # ... and what the upstream keeps
        # What each frame is handled as: the upgrade request without its handshake
        # headers (the summariser's POSTs must not carry Sec-WebSocket-Key), the caller's.
        kept = [(n, v) for n, v in request.headers.items() if n.lower() not in HANDSHAKE]
        self.frames_request = request.clone(headers=CIMultiDictProxy(CIMultiDict(kept)))
        self.frames_request[CALLER] = caller_of(request)
        self.has_budgets = request.get(TICKET) is not None

    # -- one response.create --------------------------------------------------------------

    async def on_frame(self, text: str) -> bool:
        frame = _parsed(text)
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
        ticket = Ticket(request, caller_of(request))  # meters the current (frame's) record
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
        payload = resolve(self.client_kept, frame)
        if payload is None:
            # A response this socket does not keep: the upstream's to resolve or refuse.
            log.info("previous_response_id not kept on this socket; passed through")
            self.client_kept = self.upstream_kept = None
            record.sending()
            assert self.up is not None
            await self.up.send_str(raw)
            await self._relay(record, None)
            return 200
        record.model = str(payload.get("model", ""))[:128]
        client_input = input_list(payload)
        body = orjson.dumps(payload)
        if caller_of(request).key_id is not None:  # as over HTTP: one reading of a field
            check_duplicates(raw.encode(), frame)
        # The gate, as over HTTP: nothing that costs the upstream money (a summary made
        # for this frame) before the budget says yes.
        output = await admit(request, RESPONSES_ROUTE, payload, body)
        adjusted = await before(request, body, payload)
        if adjusted.answer is not None:  # the proxy answered it (a compaction_trigger)
            end = await self._send_answer(adjusted.answer)
            self.client_kept = kept_after(client_input, end) if end else None
            return adjusted.answer.status
        incoming = Incoming(adjusted.body, adjusted.payload, read_result=adjusted.read_result)
        prepared = await prepare(request, RESPONSES_ROUTE, incoming, self.headers)
        if prepared.refusal is not None:
            raise prepared.refusal
        await reserve(request, RESPONSES_ROUTE, prepared, output)
        sent = dict(prepared.sent) if prepared.sent is not None else adjusted.payload
        up_frame, reused = upstream_frame(self.upstream_kept, sent)
        record.sending()
        # Fits means untouched: when the frame the proxy would send says what the client's
        # says (the same request, the same previous response, the same new items), the
        # client's bytes go.
        same = (
            prepared.body is body
            and frame.get("previous_response_id") == up_frame.get("previous_response_id")
            and len(input_list(frame)) == len(input_list(up_frame))
        )
        await self.to_upstream(raw if same else up_frame, reused)
        if prepared.intercepts:
            end = await self._merged(record, prepared, sent)
        else:
            end = await self._relay(record, adjusted.on_refusal, sent)
        self.client_kept = kept_after(client_input, end) if end is not None else None
        calibrate(request, RESPONSES, prepared)
        return _status_of(end)

    async def _relay(
        self,
        record: RequestRecord,
        on_refusal: Any,
        sent: dict[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """Relay one response's frames as they come; its end event (or error frame)."""
        first = True
        while True:
            message = await self.upstream_message()
            if first:
                record.answered()
                first = False
            if message.type != WSMsgType.TEXT:
                assert self.client is not None
                await send_message(self.client, message)  # (a binary frame: Codex's error to read)
                continue
            event = _parsed(message.data)
            if event is None:
                await self.to_client(message.data)
                continue
            if on_refusal is not None and is_error_frame(event) and event["status"] in (400, 422):
                answer = await on_refusal(message.data.encode())
                if answer is not None:
                    self.upstream_kept = None  # after an error, whole again (whatever it kept)
                    return await self._send_answer(answer)
            await self.to_client(message.data)
            if ends_response(event):
                self._ended(record, event, sent)
                return event

    def _ended(
        self, record: RequestRecord, event: dict[str, Any], sent: dict[str, Any] | None
    ) -> None:
        response = event.get("response")
        usage = response.get("usage") if isinstance(response, dict) else None
        if isinstance(usage, dict):
            record.meter.round(RESPONSES.usage(usage))
            record.meter.complete = True
        elif event.get("type") in ("response.completed", "response.incomplete"):
            if sent is not None and sent.get("generate") is False:
                record.meter.round(Usage())  # a prewarm: nothing generated, nothing told
            record.meter.seen_answer = True  # (else: the reservation, nothing better known)
            record.meter.complete = True
        self.upstream_kept = kept_after(input_list(sent), event) if sent is not None else None

    async def _merged(
        self, record: RequestRecord, prepared: Prepared, sent: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The read_result rounds of one response, answered on the socket: the client
        sees one response (read_result held back, later rounds continuing it)."""
        assert prepared.tool is not None
        rounds = ReadRounds(self.frames_request, prepared, RESPONSES, self.upstream, self.headers)
        merger = RESPONSES.merger(prepared.tool)
        meter = record.meter
        meter.seen_answer = True
        round_input = input_list(sent)
        first = True
        failed: dict[str, Any] | None = None  # the event a round failed with

        async def send(command: SendRound) -> Answered | Failed:
            nonlocal round_input, first, failed
            if not command.first:  # round 1 is the frame the turn sent
                payload = orjson.loads(command.body)
                round_input = input_list(payload)
                up_frame, reused = upstream_frame(self.upstream_kept, payload)
                await self.to_upstream(up_frame, reused)
            merger.begin_round()
            end: dict[str, Any] | None = None
            while end is None:
                message = await self.upstream_message()
                if first:
                    record.answered()
                    first = False
                if message.type != WSMsgType.TEXT:
                    continue  # nothing of a response: not the client's to see mid-merge
                event = _parsed(message.data)
                if event is None:
                    continue
                if is_error_frame(event):
                    await self.to_client(message.data)
                    self.upstream_kept = None
                    failed = event
                    return Failed("upstream_error" if merger.rounds > 1 else "")
                kind = str(event.get("type", ""))
                for piece in merger.feed(as_event(message.data, kind)):
                    await self.to_client(frame_of(piece))
                if kind == "response.failed":
                    self.upstream_kept = None
                    failed = event
                    return Failed("upstream_error")
                if kind in ("response.completed", "response.incomplete"):
                    end = event
            self.upstream_kept = kept_after(round_input, end)
            return Answered(merger.end_round())

        ended = await rounds.run(send)
        if ended.failed:
            return failed
        final: dict[str, Any] | None = None
        for piece in merger.finish(ended.note):
            text = frame_of(piece)
            await self.to_client(text)
            final = _parsed(text)
        meter.complete = True
        return final

    async def _send_answer(self, answer: web.StreamResponse) -> dict[str, Any] | None:
        """An answer the proxy made itself (HTTP-shaped) as frames: its events, or its
        JSON response as created and completed; an error status as an error frame."""
        body = answer.body if isinstance(answer, web.Response) else None
        raw = body if isinstance(body, bytes) else b""
        if answer.status != 200:
            await self.to_client(error_frame_of(answer.status, raw, answer.headers))
            return None
        if answer.content_type == "text/event-stream":
            frames = frames_of_sse(raw)
        else:
            response = orjson.loads(raw)
            created = {**response, "status": "in_progress", "output": [], "usage": None}
            frames = [
                orjson.dumps({"type": "response.created", "response": created}).decode(),
                orjson.dumps({"type": "response.completed", "response": response}).decode(),
            ]
        end = None
        for text in frames:
            await self.to_client(text)
            event = _parsed(text)
            if event is not None and ends_response(event):
                end = event
        current = records.current()
        if current is not None:
            current.meter.complete = True
        return end


def _parsed(text: str) -> dict[str, Any] | None:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _status_of(end: dict[str, Any] | None) -> int:
    """A frame's status for metrics and the log: an error frame's, else 200."""
    if end is not None and is_error_frame(end):
        return int(end["status"])
    return 200
