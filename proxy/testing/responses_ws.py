"""The stand-in's Responses API over WebSocket (`GET /v1/responses` upgraded), strict like
the real one as Codex speaks it (codex-rs/codex-api/src/endpoint/responses_websocket.rs):

- the upgrade needs a Bearer credential (401 before it); Codex sends `OpenAI-Beta:
  responses_websockets=...`, the openai SDK (`client.responses.connect`) no beta header,
  and both are served; the 101 carries `x-codex-turn-state` for a Codex request, as the
  HTTP answers do; permessage-deflate is agreed when offered (aiohttp's);
- each client frame is one JSON text object `{"type": "response.create", ...the HTTP
  body's fields}`; anything else (another type, not JSON, a binary frame) gets an error
  frame, a binary frame closes the socket (1003);
- `generate: false` is a prewarm: `response.created` then `response.completed` with no
  output and no usage, and the request is kept as the connection's response;
- `previous_response_id` must name the connection's most recent response (the only one
  kept): the frame's `input` then extends that response's input and output; any other id
  is refused (`previous_response_not_found`);
- the answer is the HTTP stream's events, each as one text frame (the `data:` JSON), ending
  at `response.completed` (or `incomplete`/`failed`); a refusal the HTTP route answers with
  a status is one error frame `{"type": "error", "status": N, "error": {...}, "headers":
  {...}}`; a fault `eof` cuts the connection mid-response;
- frames over `ResponsesOptions.websocket_max_frame` bytes close the socket (1009).

Every `response.create` is recorded (`RecordedRequest.transport == "websocket"`) with the
frame as sent (`body`) and the request it resolved to (`resolved`), its status (200, or
the error frame's), its kind and usage.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import WSCloseCode, WSMsgType, web

from proxy.testing.answering import answer
from proxy.testing.api import Refusal, Streamed, Whole
from proxy.testing.api_chat import openai_error, openai_gate
from proxy.testing.api_responses import (
    RESPONSES,
    ResponsesApi,
    handle_responses_get,
    turn_state,
)
from proxy.testing.responses_events import response_object
from proxy.testing.standin_http import COUNTER, RecordedRequest, paced, recorded, request_digest
from proxy.wire.responses_units import input_items

# What an error frame carries of the headers an HTTP refusal would have had.
ERROR_HEADERS = ("retry-after", "retry-after-ms", "x-request-id")


@dataclass
class _Kept:
    """The connection's most recent response: its id, and the items it extends from."""

    id: str
    items: list[Any]


def wants_websocket(request: web.Request) -> bool:
    return request.headers.get("upgrade", "").lower() == "websocket"


def _refusal(refusal: Refusal) -> bytes:
    """A refusal as the error frame the WebSocket sends instead of an HTTP error."""
    error = {"type": refusal.kind, "message": refusal.message, "param": refusal.param,
             "code": refusal.code}  # fmt: skip
    frame: dict[str, Any] = {"type": "error", "status": refusal.status, "error": error}
    headers = {n: refusal.headers[n] for n in ERROR_HEADERS if n in refusal.headers}
    if headers:
        frame["headers"] = headers
    return orjson.dumps(frame)


def _invalid(message: str, param: str | None = None, code: str | None = None) -> bytes:
    return _refusal(Refusal(400, "invalid_request_error", message, param, code))


def _prewarm_events(response_id: str, body: dict[str, Any]) -> list[bytes]:
    """What a `generate: false` frame gets: the response created and completed, empty."""
    started = response_object({"id": response_id, "model": body.get("model")}, body, [],
                              "in_progress", None)  # fmt: skip
    return [
        orjson.dumps({"type": "response.created", "sequence_number": 0, "response": started}),
        orjson.dumps({"type": "response.completed", "sequence_number": 1,
                      "response": {**started, "status": "completed"}}),
    ]  # fmt: skip


async def handle_get(request: web.Request) -> web.StreamResponse:
    """GET /v1/responses: the WebSocket when the stand-in serves it, else refused."""
    if wants_websocket(request) and request.app[RESPONSES].websocket_status == 101:
        return await serve_websocket(request)
    return await handle_responses_get(request)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/responses", handle_get)


async def serve_websocket(request: web.Request) -> web.StreamResponse:
    options = request.app[RESPONSES]
    refusal = openai_gate(request.headers)
    if refusal is not None:
        return openai_error(refusal)
    ws = web.WebSocketResponse(
        compress=True,
        max_msg_size=options.websocket_max_frame,
    )
    ws.headers.update(turn_state(request.headers, options))
    await ws.prepare(request)
    session = _Session(request, ws)
    async for message in ws:
        if message.type == WSMsgType.TEXT:
            if not await session.frame(message.data):
                break
        elif message.type == WSMsgType.BINARY:
            await ws.close(code=WSCloseCode.UNSUPPORTED_DATA, message=b"binary frames")
            break
        elif message.type == WSMsgType.ERROR:
            break
    return ws


class _Session:
    def __init__(self, request: web.Request, ws: web.WebSocketResponse) -> None:
        self.request = request
        self.ws = ws
        self.kept: _Kept | None = None
        self.api = ResponsesApi(request.app[RESPONSES], request.app[COUNTER])

    async def frame(self, raw: str) -> bool:
        """Answer one client frame; False: the connection is gone."""
        record = recorded(self.request, "WS", raw.encode())
        record.transport = "websocket"
        try:
            return await self._answer(raw, record)
        except (asyncio.CancelledError, ConnectionResetError):
            record.outcome = "cancelled"
            raise
        finally:
            if record.outcome == "open":
                record.outcome = "complete"
            record.ended_at = time.monotonic()

    async def _refuse(self, record: RecordedRequest, frame: bytes) -> bool:
        record.status = orjson.loads(frame)["status"]
        record.error = str(orjson.loads(frame)["error"].get("message", ""))
        await self.ws.send_str(frame.decode())
        return True

    async def _answer(self, raw: str, record: RecordedRequest) -> bool:
        try:
            frame = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return await self._refuse(record, _invalid(f"Invalid JSON in the frame: {exc}"))
        if not isinstance(frame, dict) or frame.get("type") != "response.create":
            kind = frame.get("type") if isinstance(frame, dict) else None
            message = f"Invalid frame type {kind!r}: expected 'response.create'."
            return await self._refuse(record, _invalid(message, "type", "invalid_type"))
        body = {k: v for k, v in frame.items() if k not in ("type", "previous_response_id")}
        generate = body.pop("generate", True)
        previous = frame.get("previous_response_id")
        if previous is not None:
            if self.kept is None or previous != self.kept.id:
                message = f"Previous response with id '{previous}' not found."
                refusal = _invalid(message, "previous_response_id", "previous_response_not_found")
                return await self._refuse(record, refusal)
            body["input"] = [*self.kept.items, *input_items(body)]
        record.resolved = orjson.dumps(body)
        if generate is False:
            response_id = "resp_" + request_digest({**body, "generate": False}, ("stream",))[:32]
            for event in _prewarm_events(response_id, body):
                await self.ws.send_str(event.decode())
            self.kept = _Kept(response_id, input_items(body))
            record.status, record.kind = 200, "prewarm"
            return True
        headers = self.request.headers
        out = await answer(
            self.request.app, self.api, headers, record.resolved, record, streaming=True
        )
        if isinstance(out, Refusal):
            return await self._refuse(record, _refusal(out))
        assert not isinstance(out, Whole)  # streams only
        record.status = 200
        return await self._stream(out, body, record)

    async def _stream(self, out: Streamed, body: dict[str, Any], record: RecordedRequest) -> bool:
        last: dict[str, Any] = {}
        async for event in paced(out.events, out.script, out.fault, asyncio.sleep):
            await self.ws.send_str(event.data.decode())
            if event.kind == "end":
                last = orjson.loads(event.data)
        if out.fault == "stream_error" and out.fault_event is not None:
            await self.ws.send_str(out.fault_event.data.decode())
            self.kept = None
            return True
        if out.fault == "eof":
            record.outcome = "cut"
            if self.request.transport is not None:
                self.request.transport.close()
            return False
        response = last.get("response") or {}
        if last.get("type") == "response.failed":
            self.kept = None
        else:
            output = list(response.get("output") or [])
            self.kept = _Kept(str(response.get("id")), [*input_items(body), *output])
        return True
