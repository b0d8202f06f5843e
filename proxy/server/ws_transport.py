"""An exchange over the Responses WebSocket: one `response.create` frame's request, sent
upstream as a frame on the socket's upstream side, its answer passed to the client as
frames (proxy/server/responses_ws.py runs one exchange per frame).

Upstream, only the new items go while the rewrite of the prefix is unchanged (each side
of the socket keeps its most recent response: proxy/wire/responses_ws.py); fits means
untouched: when the frame the proxy would send says what the client's says, the client's
bytes go. A response ends at its end event or an error frame. An answer made of
read_result rounds is merged on the socket: each round a frame upstream, its events fed
to the Responses merger and what it lets through passed on as frames, one response for
the client. An answer the proxy made itself (HTTP-shaped) goes out as frames too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import WSMsgType, web

from proxy.core.commands import Answered, Failed
from proxy.core.rounds import Ended
from proxy.core.usage import Usage
from proxy.server.bodies import Incoming, check_duplicates, check_model
from proxy.server.record import RequestRecord
from proxy.server.transport import Outgoing, Refused
from proxy.server.ws_pair import SocketPair, send_message
from proxy.wire.responses import RESPONSES
from proxy.wire.responses_units import input_items
from proxy.wire.responses_ws import (
    Kept,
    as_event,
    ends_response,
    error_frame_of,
    frame_of,
    frames_of_sse,
    is_error_frame,
    kept_after,
    parsed_frame,
    upstream_frame,
)

End = dict[str, Any] | None  # a response's end event or error frame (None: none)


@dataclass(slots=True)
class KeptResponses:
    """What each side of a socket keeps of its most recent response."""

    client: Kept | None = None  # what the client may name next
    upstream: Kept | None = None  # ... and what the upstream keeps


class FrameTransport:
    """One frame's transport (`Transport[End]`)."""

    def __init__(
        self,
        pair: SocketPair,
        kept: KeptResponses,
        record: RequestRecord,
        raw: str,
        frame: dict[str, Any],
        payload: dict[str, Any],
        *,
        key_checks: bool,
    ) -> None:
        self.pair = pair
        self.kept = kept
        self.record = record
        self.raw = raw  # the client's frame, as it came
        self.frame = frame  # ... parsed
        self.payload = payload  # the whole request it stands for
        self.key_checks = key_checks

    async def read(self) -> Incoming:
        check_model(self.payload)
        if self.key_checks:  # as over HTTP: one reading of a field
            check_duplicates(self.raw.encode(), self.frame)
        return Incoming(orjson.dumps(self.payload), self.payload)

    async def answer(self, made: web.StreamResponse) -> End:
        return await send_made(self.pair, self.record, made)

    async def send(self, outgoing: Outgoing, body: bytes) -> list[Any]:
        """One request upstream as a frame; the input it holds, whole."""
        sent = outgoing.sent if body is outgoing.body else orjson.loads(body)
        assert sent is not None
        up_frame, reused = upstream_frame(self.kept.upstream, sent)
        frame = self.frame
        same = (
            body is outgoing.body
            and not outgoing.rewritten
            and frame.get("previous_response_id") == up_frame.get("previous_response_id")
            and len(input_items(frame)) == len(input_items(up_frame))
        )
        await self.pair.to_upstream(self.raw if same else up_frame, reused)
        return input_items(sent)

    async def relay(self, outgoing: Outgoing) -> End:
        await self.send(outgoing, outgoing.body)
        return await relay_response(self.pair, self.kept, self.record, outgoing)

    def merging(self, outgoing: Outgoing) -> FrameMerging:
        return FrameMerging(self, outgoing)


async def relay_response(
    pair: SocketPair, kept: KeptResponses, record: RequestRecord, outgoing: Outgoing | None
) -> End:
    """Relay one response's frames as they come; its end event (or error frame)."""
    on_refusal: Refused | None = outgoing.on_refusal if outgoing is not None else None
    sent = outgoing.sent if outgoing is not None else None
    while True:
        message = await pair.upstream_message()
        record.answered()
        if message.type != WSMsgType.TEXT:
            assert pair.client is not None
            await send_message(pair.client, message)  # (a binary frame: Codex's error to read)
            continue
        event = parsed_frame(message.data)
        if event is None:
            await pair.to_client(message.data)
            continue
        if on_refusal is not None and is_error_frame(event) and event["status"] in (400, 422):
            answer = await on_refusal(message.data.encode())
            if answer is not None:
                kept.upstream = None  # after an error, whole again (whatever it kept)
                return await send_made(pair, record, answer)
        await pair.to_client(message.data)
        if ends_response(event):
            _metered(record, event, sent)
            kept.upstream = kept_after(input_items(sent), event) if sent is not None else None
            return event


def _metered(record: RequestRecord, event: dict[str, Any], sent: Mapping[str, Any] | None) -> None:
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


class FrameMerging:
    """The read_result rounds of one response, answered on the socket (`Merging[End]`):
    the client sees one response (read_result held back, later rounds continuing it)."""

    def __init__(self, transport: FrameTransport, outgoing: Outgoing) -> None:
        assert outgoing.tool is not None
        self.transport = transport
        self.outgoing = outgoing
        self.merger = RESPONSES.merger(outgoing.tool)
        self.failed: End = None  # the event a round failed with
        transport.record.meter.seen_answer = True

    async def round(self, body: bytes) -> Answered | Failed:
        transport, merger = self.transport, self.merger
        pair, kept, record = transport.pair, transport.kept, transport.record
        round_input = await transport.send(self.outgoing, body)
        merger.begin_round()
        while True:
            message = await pair.upstream_message()
            record.answered()
            if message.type != WSMsgType.TEXT:
                continue  # nothing of a response: not the client's to see mid-merge
            event = parsed_frame(message.data)
            if event is None:
                continue
            if is_error_frame(event):
                await pair.to_client(message.data)
                kept.upstream, self.failed = None, event
                return Failed("upstream_error" if merger.rounds > 1 else "")
            kind = str(event.get("type", ""))
            for piece in merger.feed(as_event(message.data, kind)):
                await pair.to_client(frame_of(piece))
            if kind == "response.failed":
                kept.upstream, self.failed = None, event
                return Failed("upstream_error")
            if kind in ("response.completed", "response.incomplete"):
                kept.upstream = kept_after(round_input, event)
                return Answered(merger.end_round())

    async def finish(self, ended: Ended) -> End:
        if ended.failed:
            return self.failed
        final: End = None
        pair = self.transport.pair
        for piece in self.merger.finish(ended.note):
            text = frame_of(piece)
            await pair.to_client(text)
            final = parsed_frame(text)
        self.transport.record.meter.complete = True
        return final


async def send_made(pair: SocketPair, record: RequestRecord, answer: web.StreamResponse) -> End:
    """An answer the proxy made itself (HTTP-shaped) as frames: its events, or its JSON
    response as created and completed; an error status as an error frame (returned)."""
    body = answer.body if isinstance(answer, web.Response) else None
    raw = body if isinstance(body, bytes) else b""
    if answer.status != 200:
        frame = error_frame_of(answer.status, raw, answer.headers)
        await pair.to_client(frame)
        return parsed_frame(frame)
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
        await pair.to_client(text)
        event = parsed_frame(text)
        if event is not None and ends_response(event):
            end = event
    record.meter.complete = True
    return end
