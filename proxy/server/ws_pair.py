"""Two WebSockets relayed as one: a client's (aiohttp's server) and its upstream's (aiohttp's
client), for `GET /v1/responses` (proxy/server/responses_ws.py drives the frames).

- The upstream socket is opened before the client's upgrade is answered, with the client's
  end-to-end headers as HTTP requests carry them (credential, betas, session ids;
  hop-by-hop and the client's own Sec-WebSocket-* handshake left out), permessage-deflate
  offered upstream when the client offered it, its subprotocol passed on. The 101 the
  client gets carries the upstream's end-to-end response headers (x-codex-turn-state,
  openai-model, x-models-etag, x-reasoning-included, ...).
- An upstream that refuses the upgrade gets the client a 426 (Codex then uses HTTP for the
  session at once); 401, 403 and 429 keep their status; an unreachable upstream is 502.
- Both sockets are read all the time (ping/pong every `websocket_heartbeat` seconds, and
  frames of at most `websocket_max_frame` bytes: a bigger one closes that socket, 1009)
  into one bounded inbox, so frames keep their order and a slow client holds its upstream
  back. A close from either side is passed to the other with its code; a socket with no
  request for `websocket_idle_timeout` is closed (1000), an upstream silent for
  `upstream.stream_idle_timeout` in the middle of a response closes both (1011), and while
  the proxy drains for shutdown a socket closes (1001) as soon as no response is under way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any

import aiohttp
import orjson
from aiohttp import WSCloseCode, WSMessage, WSMsgType, web
from multidict import CIMultiDict

from proxy.core.errors import ProxyError, UpgradeRequired, UpstreamError
from proxy.server.headers import client_response_headers, upstream_request_headers
from proxy.server.lifecycle import LIFECYCLE
from proxy.server.metrics import METRICS
from proxy.server.record import RequestRecord
from proxy.server.routing import OPENAI_UPSTREAM
from proxy.server.state import SETTINGS
from proxy.server.upstream import Upstream

log = logging.getLogger(__name__)

# The client's own handshake: aiohttp makes the upstream's.
HANDSHAKE = frozenset(
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
CLOSED = (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR)


class Gone(Exception):
    """A socket closed: `side` ("client" or "upstream"), with its close code; "proxy":
    the proxy closes both."""

    def __init__(self, side: str, code: int | None, reason: bytes = b"") -> None:
        super().__init__(side)
        self.side, self.code, self.reason = side, code, reason


class SocketPair:
    """One client socket and its upstream socket; `on_frame` (a subclass's) answers each
    client text frame while no response is under way."""

    def __init__(self, request: web.Request, upgrade: RequestRecord | None) -> None:
        self.request = request
        self.upgrade = upgrade  # the upgrade request's record (None: none kept)
        self.app = request.app
        self.settings = request.app[SETTINGS].responses
        self.upstream: Upstream = request.app[OPENAI_UPSTREAM]
        self.metrics = request.app[METRICS]
        self.headers = [
            (n, v)
            for n, v in upstream_request_headers(request.headers)
            if n.lower() not in HANDSHAKE
        ]
        # Both sockets' frames, in arrival order; bounded, so a client slower than its
        # upstream holds the upstream back (its reader stops, then TCP does).
        self.inbox: asyncio.Queue[tuple[str, WSMessage]] = asyncio.Queue(INBOX_FRAMES)
        self.pending: deque[WSMessage] = deque()  # client frames that came mid-response
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
            return await upstream.connect_ws(
                request.raw_path,
                headers=self.headers,
                protocols=protocols,
                compress=15 if "permessage-deflate" in offered else 0,
                max_msg_size=self.settings.websocket_max_frame,
                heartbeat=self.settings.websocket_heartbeat,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=10.0),
            )
        except aiohttp.WSServerHandshakeError as e:
            raise self._refused(e) from None
        except UpstreamError:
            self.metrics.websocket_sessions.labels("failed").inc()
            raise

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
        upgrade = self.upgrade
        if upgrade is not None:  # the upgrade was answered; its frames count as their own
            upgrade.meter.complete = True  # (a client that goes away is no 499 of it)
        self.metrics.websocket_open.inc()
        pumps = [
            asyncio.create_task(self._pump("client", client)),
            asyncio.create_task(self._pump("upstream", up)),
        ]
        try:
            await self._run()
        except Gone as gone:
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
            if message.type in CLOSED:
                return

    async def _close_other(self, gone: Gone) -> None:
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
            if message.type in CLOSED:
                raise Gone(side, _close_code(message), _close_reason(message))
            if side == "upstream":  # between responses: passed on as it came
                await send_message(client, message)
                self.metrics.websocket_frames.labels("upstream_to_client").inc()
                continue
            if message.type == WSMsgType.TEXT and await self.on_frame(message.data):
                continue
            await send_message(up, message)  # not the subclass's: the upstream's to answer
            self.metrics.websocket_frames.labels("client_to_upstream").inc()

    async def on_frame(self, text: str) -> bool:
        """Answer one client text frame; False: relay it to the upstream as it is."""
        return False

    async def _between_responses(self) -> tuple[str, WSMessage]:
        """The next frame while no response is under way; Gone("proxy") when the socket
        stays idle too long (1000), or the proxy is shutting down (1001: Codex opens a new
        socket, on a replica that is not)."""
        lifecycle = self.app[LIFECYCLE]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.websocket_idle_timeout
        while True:
            if lifecycle.draining:
                raise Gone("proxy", WSCloseCode.GOING_AWAY, b"shutting down")
            left = deadline - loop.time()
            if left <= 0:
                raise Gone("proxy", WSCloseCode.OK, b"idle")
            try:
                return await asyncio.wait_for(self.inbox.get(), min(DRAIN_POLL, left))
            except TimeoutError:
                continue

    async def upstream_message(self) -> WSMessage:
        """The next upstream frame of the response under way (client frames meanwhile
        wait their turn); _Gone when a socket closes, or the upstream stays silent."""
        idle = self.upstream.settings.stream_idle_timeout
        while True:
            try:
                side, message = await asyncio.wait_for(self.inbox.get(), idle)
            except TimeoutError:
                raise Gone("upstream", WSCloseCode.INTERNAL_ERROR, b"upstream idle") from None
            if message.type in CLOSED:
                raise Gone(side, _close_code(message), _close_reason(message))
            if side == "client":
                self.pending.append(message)
                continue
            return message

    async def to_client(self, text: str) -> None:
        assert self.client is not None
        await self.client.send_str(text)
        self.metrics.websocket_frames.labels("upstream_to_client").inc()

    async def to_upstream(self, frame: dict[str, Any] | str, reused: int) -> None:
        """A request frame (a str: as the client sent it); `reused`: items it leaves to
        the upstream's kept response (0: it holds the whole input)."""
        assert self.up is not None
        text = frame if isinstance(frame, str) else orjson.dumps(frame).decode()
        form = "incremental" if reused else "whole"
        self.metrics.websocket_upstream_bytes.labels(form).inc(len(text))
        self.metrics.websocket_frames.labels("client_to_upstream").inc()
        await self.up.send_str(text)


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


def _close_code(message: WSMessage) -> int | None:
    return (
        message.data if message.type == WSMsgType.CLOSE and isinstance(message.data, int) else None
    )


def _close_reason(message: WSMessage) -> bytes:
    extra = message.extra if message.type == WSMsgType.CLOSE else None
    return extra.encode()[:120] if isinstance(extra, str) else b""


async def send_message(ws: Any, message: WSMessage) -> None:
    if message.type == WSMsgType.TEXT:
        await ws.send_str(message.data)
    elif message.type == WSMsgType.BINARY:
        await ws.send_bytes(message.data)
