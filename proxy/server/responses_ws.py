"""`GET /v1/responses` upgraded to a WebSocket: Codex's first choice, relayed and compacted.

One upstream socket per client socket (aiohttp's WebSocket server towards the client, its
client towards the upstream), opened before the client's upgrade is answered:

- the upgrade carries the client's end-to-end headers as HTTP requests do (credential,
  betas, session ids; hop-by-hop and the client's own Sec-WebSocket-* handshake left out,
  permessage-deflate offered upstream when the client offered it); the 101 the client gets
  carries the upstream's end-to-end response headers (x-codex-turn-state, openai-model,
  x-models-etag, x-reasoning-included, ...);
- an upstream that refuses the upgrade gets the client a 426 (Codex then uses HTTP for
  the session at once); 401, 403 and 429 keep their status; `[responses] websocket =
  "refuse"` answers 426 without asking the upstream;
- frames go in order both ways; ping/pong on both sockets (`websocket_heartbeat`), frames
  bounded (`websocket_max_frame`: a bigger one closes that socket with 1009), a socket
  without a request for `websocket_idle_timeout` is closed (1000), an upstream silent for
  `upstream.stream_idle_timeout` in the middle of a response closes both (1011); a close
  from either side is passed to the other with its code. While the proxy drains for
  shutdown, a socket closes (1001) as soon as no response is under way on it.

Each `response.create` goes through the driver of an HTTP Responses request
(proxy/server/responses.py `before`, routes.py `_prepare` and `_reserve`): resolved to the
whole request first against what this socket saw (proxy/wire/responses_ws.py), counted,
offloaded, folded, refused when nothing fits, Codex's compaction_trigger served or passed
through, the caller's budgets reserved and settled per frame (its own Ticket), usage
metered from the events; upstream, only the new items go while the rewrite of the prefix
is unchanged. A rewritten request's read_result rounds are answered on the socket and
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
import secrets
import time
from collections import deque
from typing import Any

import aiohttp
import orjson
from aiohttp import WSCloseCode, WSMessage, WSMsgType, web
from multidict import CIMultiDict

from proxy.core.errors import NotAuthenticated, ProxyError, UpgradeRequired
from proxy.core.errors import StoreUnavailable as CannotCheck
from proxy.core.usage import Usage
from proxy.server import budgets
from proxy.server import record as records
from proxy.server.bodies import output_tokens
from proxy.server.budgets import STORE_DOWN_RETRY_AFTER, TICKET, Ticket
from proxy.server.caller import caller_of, count_rejection
from proxy.server.compactor import Prepared
from proxy.server.errors import render, upstream_failure
from proxy.server.fleet import FLEET
from proxy.server.headers import client_response_headers, upstream_request_headers
from proxy.server.lifecycle import LIFECYCLE
from proxy.server.logs import REQUEST_LOG
from proxy.server.metrics import METRICS, REQUEST_ENDED
from proxy.server.passthrough import handle_passthrough
from proxy.server.read_rounds import ReadRounds
from proxy.server.record import RequestRecord
from proxy.server.responses import RESPONSES_ROUTE, before
from proxy.server.routes import Incoming, _calibrate, _prepare, _reserve
from proxy.server.routing import OPENAI_UPSTREAM
from proxy.server.state import SETTINGS
from proxy.server.upstream import Upstream
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
# The client's own handshake: aiohttp makes the upstream's.
_HANDSHAKE = frozenset(
    {
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-accept",
        "sec-websocket-protocol",
    }
)
INBOX_FRAMES = 256
DRAIN_POLL = 0.5  # seconds between looks at the shutdown flag on an idle socket
_KEEP_STATUS = (401, 403, 429)  # upgrade refusals the client gets as they are
_CLOSED = (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR)


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


class _Gone(Exception):
    """A socket closed: `side` ("client" or "upstream"), with its close code; "proxy":
    the proxy closes both."""

    def __init__(self, side: str, code: int | None, reason: bytes = b"") -> None:
        super().__init__(side)
        self.side, self.code, self.reason = side, code, reason


class Relay:
    """One client socket and its upstream socket."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.app = request.app
        self.settings = request.app[SETTINGS].responses
        self.upstream: Upstream = request.app[OPENAI_UPSTREAM]
        self.metrics = request.app[METRICS]
        self.headers = [
            (n, v)
            for n, v in upstream_request_headers(request.headers)
            if n.lower() not in _HANDSHAKE
        ]
        # Both sockets' frames, in arrival order; bounded, so a client slower than its
        # upstream holds the upstream back (its reader stops, then TCP does).
        self.inbox: asyncio.Queue[tuple[str, WSMessage]] = asyncio.Queue(INBOX_FRAMES)
        self.pending: deque[WSMessage] = deque()  # client frames that came mid-response
        self.client_kept: Kept | None = None  # what the client may name next
        self.upstream_kept: Kept | None = None  # ... and what the upstream keeps
        self.client: web.WebSocketResponse | None = None
        self.up: aiohttp.ClientWebSocketResponse | None = None

    # -- the upgrade ----------------------------------------------------------------------

    async def _connect(self) -> aiohttp.ClientWebSocketResponse:
        request, upstream = self.request, self.upstream
        protocols = [
            p.strip()
            for value in request.headers.getall("Sec-WebSocket-Protocol", ())
            for p in value.split(",")
            if p.strip()
        ]
        offered = request.headers.get("Sec-WebSocket-Extensions", "").lower()
        try:
            return await upstream.session.ws_connect(
                upstream.url(request.raw_path),
                headers=self.headers,
                protocols=protocols,
                compress=15 if "permessage-deflate" in offered else 0,
                max_msg_size=self.settings.websocket_max_frame,
                heartbeat=self.settings.websocket_heartbeat,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=10.0),
            )
        except aiohttp.WSServerHandshakeError as e:
            raise self._refused(e) from None
        except (aiohttp.ClientError, TimeoutError) as e:
            self.metrics.websocket_sessions.labels("failed").inc()
            raise upstream_failure(e, upstream.shown_url, upstream.settings.connect_timeout) from e

    def _refused(self, e: aiohttp.WSServerHandshakeError) -> ProxyError:
        status = e.status
        if status in _KEEP_STATUS:
            self.metrics.websocket_sessions.labels("failed").inc()
            return _Refusal(status, e.headers)
        self.metrics.websocket_sessions.labels("refused").inc()
        log.info("the upstream refused the WebSocket upgrade (%s); the client gets 426", status)
        return UpgradeRequired(
            f"The upstream does not serve WebSocket connections to /v1/responses (it answered"
            f" {status}); use HTTP POST."
        )

    async def serve(self) -> web.StreamResponse:
        up = self.up = await self._connect()
        settings = self.settings
        client = self.client = web.WebSocketResponse(
            compress=up.compress > 0,
            max_msg_size=settings.websocket_max_frame,
            heartbeat=settings.websocket_heartbeat,
            protocols=(up.protocol,) if up.protocol else (),
        )
        for name, value in client_response_headers(_handshake_headers(up)).items():
            if not name.lower().startswith("sec-websocket"):
                client.headers.add(name, value)
        try:
            await client.prepare(self.request)
        except BaseException:
            await up.close()
            raise
        self.metrics.websocket_sessions.labels("relayed").inc()
        upgrade = records.current()
        if upgrade is not None:  # the upgrade was answered; its frames count as their own
            upgrade.meter.complete = True  # (a client that goes away is no 499 of it)
        self.metrics.websocket_open.inc()
        pumps = [
            asyncio.create_task(self._pump("client", client)),
            asyncio.create_task(self._pump("upstream", up)),
        ]
        try:
            await self._run()
        except _Gone as gone:
            await self._close_other(gone)
        finally:
            self.metrics.websocket_open.dec()
            for task in pumps:
                task.cancel()
            with contextlib.suppress(Exception):
                await up.close()
            with contextlib.suppress(Exception):
                await client.close()
        return client

    async def _pump(self, side: str, ws: Any) -> None:
        while True:
            message = await ws.receive()
            await self.inbox.put((side, message))
            if message.type in _CLOSED:
                return

    async def _close_other(self, gone: _Gone) -> None:
        """Pass a close on with its code (the proxy's own: to both sides)."""
        code = gone.code if gone.code and gone.code >= 1000 else WSCloseCode.INTERNAL_ERROR
        if gone.side == "proxy":
            others = [self.client, self.up]
        else:
            others = [self.up if gone.side == "client" else self.client]
        for other in others:
            if other is not None and not other.closed:
                with contextlib.suppress(Exception):
                    await other.close(code=code, message=gone.reason)

    # -- the frames -----------------------------------------------------------------------

    async def _run(self) -> None:
        client = self.client
        up = self.up
        assert client is not None and up is not None
        while True:
            if self.pending:
                side, message = "client", self.pending.popleft()
            else:
                side, message = await self._between_responses()
            if message.type in _CLOSED:
                raise _Gone(side, _close_code(message), _close_reason(message))
            if side == "upstream":  # between responses: passed on as it came
                await _send(client, message)
                self.metrics.websocket_frames.labels("upstream_to_client").inc()
                continue
            if message.type == WSMsgType.TEXT:
                frame = _parsed(message.data)
                if frame is not None and frame.get("type") == CREATE:
                    await self._create(message.data, frame)
                    continue
            await _send(up, message)  # another frame type: the upstream's to answer
            self.metrics.websocket_frames.labels("client_to_upstream").inc()

    async def _between_responses(self) -> tuple[str, WSMessage]:
        """The next frame while no response is under way; _Gone("proxy") when the socket
        stays idle too long (1000), or the proxy is shutting down (1001: Codex opens a new
        socket, on a replica that is not)."""
        lifecycle = self.app[LIFECYCLE]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.websocket_idle_timeout
        while True:
            if lifecycle.draining:
                raise _Gone("proxy", WSCloseCode.GOING_AWAY, b"shutting down")
            left = deadline - loop.time()
            if left <= 0:
                raise _Gone("proxy", WSCloseCode.OK, b"idle")
            try:
                return await asyncio.wait_for(self.inbox.get(), min(DRAIN_POLL, left))
            except TimeoutError:
                continue

    async def _upstream_message(self) -> WSMessage:
        """The next upstream frame of the response under way (client frames meanwhile
        wait their turn); _Gone when a socket closes, or the upstream stays silent."""
        idle = self.upstream.settings.stream_idle_timeout
        while True:
            try:
                side, message = await asyncio.wait_for(self.inbox.get(), idle)
            except TimeoutError:
                raise _Gone("upstream", WSCloseCode.INTERNAL_ERROR, b"upstream idle") from None
            if message.type in _CLOSED:
                raise _Gone(side, _close_code(message), _close_reason(message))
            if side == "client":
                self.pending.append(message)
                continue
            return message

    async def _to_client(self, text: str) -> None:
        assert self.client is not None
        await self.client.send_str(text)
        self.metrics.websocket_frames.labels("upstream_to_client").inc()

    async def _to_upstream(self, frame: dict[str, Any], reused: int) -> None:
        assert self.up is not None
        data = orjson.dumps(frame)
        self.metrics.websocket_upstream_bytes.labels("incremental" if reused else "whole").inc(
            len(data)
        )
        self.metrics.websocket_frames.labels("client_to_upstream").inc()
        await self.up.send_str(data.decode())

    # -- one response.create --------------------------------------------------------------

    async def _create(self, raw: str, frame: dict[str, Any]) -> None:
        record = RequestRecord(secrets.token_hex(8), ROUTE, "WS")
        record.reads_answers_as(RESPONSES)
        token = records.begin(record)
        status = 500
        try:
            async with self._ticket():
                status = await self._drive(raw, frame, record)
        except ProxyError as error:
            status = error.status
            response = render(error, RESPONSES)
            body = response.body if isinstance(response.body, bytes) else b""
            await self._to_client(error_frame_of(error.status, body, response.headers))
        except asyncio.CancelledError:
            status = 200 if record.meter.complete else 499
            raise
        except _Gone as gone:
            status = 200 if record.meter.complete else 499 if gone.side == "client" else 502
            raise
        except Exception:
            # A fault of the proxy's own mid-frame: the socket's state is unknown from
            # here, so the client is told and both sockets close (Codex opens a new one).
            log.exception("WebSocket frame failed; closing the socket")
            status = 500
            failure = {"type": "api_error", "message": "compaction-proxy failed on this request"}
            with contextlib.suppress(Exception):
                await self._to_client(error_frame(500, failure))
            raise _Gone("proxy", WSCloseCode.INTERNAL_ERROR, b"internal error") from None
        finally:
            ended = time.perf_counter()
            records.end(token)
            self.metrics.record(record, status, ended)
            self.app[REQUEST_LOG].emit(record, status, ended)
            for listener in self.app.get(REQUEST_ENDED, ()):
                listener(record, status)

    def _ticket(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """The frame's own budget ticket (reserve, then settle to its usage), when the
        caller has budgets."""
        request = self.request
        if request.get(TICKET) is None:
            return contextlib.nullcontext()
        ticket = Ticket(request, caller_of(request))  # meters the current (frame's) record
        request[TICKET] = ticket
        return ticket

    async def _key_still_good(self) -> None:
        """A proxy key checked at the upgrade is checked again for every frame (its
        record at most `auth.cache_seconds` old): a revoked key stops being served on a
        socket it opened before."""
        caller = caller_of(self.request)
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
        request = self.request
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
        output = output_tokens(payload) if budgets.applies(request) else 0
        adjusted = await before(request, body, payload)
        if adjusted.answer is not None:  # the proxy answered it (a compaction_trigger)
            end = await self._send_answer(adjusted.answer)
            self.client_kept = kept_after(client_input, end) if end else None
            return adjusted.answer.status
        incoming = Incoming(adjusted.body, adjusted.payload)
        prepared = await _prepare(request, RESPONSES_ROUTE, incoming, self.headers)
        if prepared.refusal is not None:
            raise prepared.refusal
        if not adjusted.read_result:
            prepared.tool = None
        await _reserve(request, RESPONSES_ROUTE, prepared, output)
        sent = dict(prepared.sent) if prepared.sent is not None else adjusted.payload
        up_frame, reused = upstream_frame(self.upstream_kept, sent)
        record.sending()
        await self._to_upstream(up_frame, reused)
        if prepared.intercepts:
            end = await self._merged(record, prepared, sent)
        else:
            end = await self._relay(record, adjusted.on_refusal, sent)
        self.client_kept = kept_after(client_input, end) if end is not None else None
        _calibrate(request, RESPONSES, prepared)
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
            message = await self._upstream_message()
            if first:
                record.answered()
                first = False
            if message.type != WSMsgType.TEXT:
                assert self.client is not None
                await _send(self.client, message)  # (a binary frame: Codex's error to read)
                continue
            event = _parsed(message.data)
            if event is None:
                await self._to_client(message.data)
                continue
            if on_refusal is not None and is_error_frame(event) and event["status"] in (400, 422):
                answer = await on_refusal(message.data.encode())
                if answer is not None:
                    self.upstream_kept = None  # after an error, whole again (whatever it kept)
                    return await self._send_answer(answer)
            await self._to_client(message.data)
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
        rounds = ReadRounds(self.request, prepared, RESPONSES, self.upstream, self.headers)
        merger = RESPONSES.merger(prepared.tool)
        meter = record.meter
        meter.seen_answer = True
        round_input = input_list(sent)
        note = None
        first = True
        while True:
            merger.begin_round()
            end: dict[str, Any] | None = None
            while end is None:
                message = await self._upstream_message()
                if first:
                    record.answered()
                    first = False
                if message.type != WSMsgType.TEXT:
                    continue  # nothing of a response: not the client's to see mid-merge
                event = _parsed(message.data)
                if event is None:
                    continue
                if is_error_frame(event):
                    record.read_outcome = "upstream_error" if merger.rounds > 1 else ""
                    await self._to_client(message.data)
                    self.upstream_kept = None
                    return event
                kind = str(event.get("type", ""))
                for piece in merger.feed(as_event(message.data, kind)):
                    await self._to_client(frame_of(piece))
                if kind == "response.failed":
                    record.read_outcome = "upstream_error"
                    self.upstream_kept = None
                    return event
                if kind in ("response.completed", "response.incomplete"):
                    end = event
            self.upstream_kept = kept_after(round_input, end)
            round_ = merger.end_round()
            meter.round(round_.usage)
            if not round_.wants_reads_only:
                record.read_outcome = "complete"
                break
            body = await rounds.next_body(round_)
            if isinstance(body, str):
                note = rounds.stop_note(body)
                break
            payload = orjson.loads(body)
            round_input = input_list(payload)
            up_frame, reused = upstream_frame(self.upstream_kept, payload)
            await self._to_upstream(up_frame, reused)
        final: dict[str, Any] | None = None
        for piece in merger.finish(note):
            text = frame_of(piece)
            await self._to_client(text)
            final = _parsed(text)
        meter.complete = True
        return final

    async def _send_answer(self, answer: web.StreamResponse) -> dict[str, Any] | None:
        """An answer the proxy made itself (HTTP-shaped) as frames: its events, or its
        JSON response as created and completed; an error status as an error frame."""
        body = answer.body if isinstance(answer, web.Response) else None
        raw = body if isinstance(body, bytes) else b""
        if answer.status != 200:
            await self._to_client(error_frame_of(answer.status, raw, answer.headers))
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
            await self._to_client(text)
            event = _parsed(text)
            if event is not None and ends_response(event):
                end = event
        current = records.current()
        if current is not None:
            current.meter.complete = True
        return end


class _Refusal(ProxyError):
    """An upgrade refusal passed on with its status (401, 403, 429)."""

    def __init__(self, status: int, headers: Any) -> None:
        super().__init__(f"The upstream refused the WebSocket upgrade ({status}).")
        self.status = status
        self.type = {401: "authentication_error", 403: "permission_error"}.get(
            status, "rate_limit_error"
        )
        self._retry = {
            n: headers[n] for n in ("retry-after", "retry-after-ms") if headers and n in headers
        }

    def headers(self) -> dict[str, str]:
        return {**super().headers(), **self._retry}


def _handshake_headers(ws: aiohttp.ClientWebSocketResponse) -> Any:
    """The upstream's 101 response headers (aiohttp keeps the response it upgraded)."""
    response = getattr(ws, "_response", None)
    headers = getattr(response, "headers", None)
    return headers if headers is not None else CIMultiDict()


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


def _close_code(message: WSMessage) -> int | None:
    return (
        message.data if message.type == WSMsgType.CLOSE and isinstance(message.data, int) else None
    )


def _close_reason(message: WSMessage) -> bytes:
    extra = message.extra if message.type == WSMsgType.CLOSE else None
    return extra.encode()[:120] if isinstance(extra, str) else b""


async def _send(ws: Any, message: WSMessage) -> None:
    if message.type == WSMsgType.TEXT:
        await ws.send_str(message.data)
    elif message.type == WSMsgType.BINARY:
        await ws.send_bytes(message.data)
