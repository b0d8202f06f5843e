"""Answer the injected read_result tool inside the proxy, invisibly to the client.

When a rewritten request carried `read_result`, its upstream answer comes here instead of
the byte relay. What happens round after round is decided by the read rounds' generator
(proxy/core/rounds.py: read the slices, fit the round to the window, top up the budget,
send it, up to the policy's number of rounds); this shell carries its commands out with
its `RoundExecutor` (reading results from the store, topping up budgets) and a transport
that sends a round and relays its answer. The client gets one message: whole, the
rounds' answers merged into one; in a stream, read_result blocks are held back and later
rounds continue the same message (the wire format's RoundMerger); a call mixed with
client tool calls is removed from what the client sees, so nothing is left unanswered in
its history. A Responses WebSocket brings its own transport
(proxy/server/responses_ws.py).

When the rounds stop while the model still wanted to read (the round limit, the window,
a budget), the message ends with the generator's note saying why, so the client always
gets a valid, non-empty answer. How the rounds ended is the record's `read_outcome` (log
line and metric).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, assert_never

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy.core.commands import (
    Answered,
    Failed,
    ReadResults,
    Results,
    RoundCommand,
    RoundReply,
    SendRound,
    ToppedUp,
    TopUp,
)
from proxy.core.errors import UpstreamGarbage
from proxy.core.rounds import Ended, RoundsRequest, read_rounds
from proxy.core.sse import SSEDecoder
from proxy.core.wire_format import JSON, MergeState, Round, RoundMerger, WireFormat
from proxy.server import budgets
from proxy.server.compactor import Prepared
from proxy.server.executor import drive
from proxy.server.headers import client_response_headers
from proxy.server.record import current_or_throwaway
from proxy.server.relay import cut_client, relay
from proxy.server.state import COMPACTOR, STORE
from proxy.server.upstream import AnswerTooLarge, Upstream, read_bounded
from proxy.store import Store, StoreUnavailable

log = logging.getLogger(__name__)

# The transport's part of a round: send it (round 1 is in hand) and relay its answer.
Send = Callable[[SendRound], Awaitable[Answered | Failed]]
ENDINGS = {
    "window": "read_result round would not fit the window; ending the answer",
    "budget": "read_result round refused by a budget; ending the answer",
}


class RoundExecutor:
    """The commands of one answer's read rounds. `send` is the transport's part: send a
    round (round 1 is in hand already) and relay its answer; `top_up` holds a round in
    the caller's budgets. `sending`: the seconds spent in `send` (the rest of the rounds'
    time is the proxy's own)."""

    def __init__(
        self,
        store: Store | None,
        tenant: str,
        conversation: str,
        *,
        send: Send,
        top_up: Callable[[TopUp], Awaitable[bool]],
    ) -> None:
        self.store = store
        self.tenant = tenant
        self.conversation = conversation
        self.send = send
        self.top_up = top_up
        self.sending = 0.0

    async def __call__(self, command: RoundCommand) -> RoundReply:
        match command:
            case SendRound():
                began = time.perf_counter()
                try:
                    return await self.send(command)
                finally:
                    self.sending += time.perf_counter() - began
            case ReadResults():
                return await self._read(command)
            case TopUp():
                return ToppedUp(await self.top_up(command))
            case _:
                assert_never(command)

    async def _read(self, command: ReadResults) -> Results:
        """One read a ref, in order; a store that fails one is unavailable for that one."""
        texts: list[str | None] = []
        unavailable: list[bool] = []
        for ref in command.refs:
            text, down = None, self.store is None
            if self.store is not None:
                try:
                    text = await self.store.read_blob(self.tenant, self.conversation, ref)
                except StoreUnavailable:
                    down = True
            texts.append(text)
            unavailable.append(down)
        return Results(tuple(texts), tuple(unavailable))


class ReadRounds:
    """One client request's rounds against the upstream."""

    def __init__(
        self,
        request: web.Request,
        prepared: Prepared,
        wire: WireFormat,
        upstream: Upstream,
        upstream_headers: list[tuple[str, str]],
    ) -> None:
        assert prepared.tool is not None and prepared.sent is not None
        assert prepared.factor is not None  # looked up when the request was rewritten
        self.request = request
        self.prepared = prepared
        self.tool: str = prepared.tool
        self.wire = wire
        self.upstream = upstream
        self.upstream_headers = upstream_headers
        self.record = current_or_throwaway()
        counter = request.app[COMPACTOR].counter
        self.plan = RoundsRequest(
            wire, prepared.sent, prepared.body, prepared.refs, counter,
            prepared.policy, prepared.factor,
        )  # fmt: skip

    async def answer(self, response: aiohttp.ClientResponse) -> web.StreamResponse:
        if response.headers.get("Content-Type", "").startswith("text/event-stream"):
            return await self.stream(response)
        return await self.whole(response)

    async def run(self, send: Send) -> Ended:
        """The rounds' commands carried out, `send` being the transport's part; how they
        ended is recorded. The time outside `send` is the proxy's own (the record's
        interception_seconds)."""
        prepared = self.prepared
        executor = RoundExecutor(
            self.request.app[STORE].store,
            prepared.tenant,
            prepared.conversation,
            send=self._counted(send),
            top_up=self._top_up,
        )
        began = time.perf_counter()
        try:
            ended = await drive(read_rounds(self.plan), executor)
        finally:
            self.record.interception_seconds += time.perf_counter() - began - executor.sending
        if ended.outcome in ENDINGS:
            log.info(ENDINGS[ended.outcome])
        self.record.read_outcome = ended.outcome
        return ended

    def _counted(self, send: Send) -> Send:
        """`send` with what every transport records of a round: the read rounds sent,
        and each answer's usage."""

        async def counted(command: SendRound) -> Answered | Failed:
            if not command.first:
                self.record.read_rounds += 1
            answered = await send(command)
            if isinstance(answered, Answered):
                self.record.meter.round(answered.round.usage)
            return answered

        return counted

    async def _top_up(self, command: TopUp) -> bool:
        return await budgets.top_up(self.request, command.tokens, command.output)

    async def _send(self, command: SendRound, stream: bool) -> aiohttp.ClientResponse:
        """A read round (not the first: the route sent that) to the upstream."""
        return await self.upstream.send(
            "POST",
            self.request.raw_path,
            self.upstream_headers,
            command.body,
            stream=stream,
            purpose="read_round",
        )

    # -- not streaming -------------------------------------------------------------------

    def _read_answer(self, raw: bytes) -> tuple[JSON, Round]:
        """One round's answer and what it asks; UpstreamGarbage (502) when the upstream
        said 200 but sent something that is not an answer of this API."""
        try:
            message = orjson.loads(raw)
            if not isinstance(message, dict):
                raise TypeError(f"a JSON {type(message).__name__}, not an object")
            return message, self.wire.split(message, self.tool)
        except Exception as e:
            raise garbage(e) from None

    async def whole(self, response: aiohttp.ClientResponse) -> web.StreamResponse:
        if response.status != 200:
            return await relay(self.request, response, self.prepared.headers, wire=self.wire)
        headers = client_response_headers(response.headers)
        answers: list[JSON] = []
        meter = self.record.meter
        meter.seen_answer = True  # the upstream answered: with no usage read, it costs the lot
        refused: aiohttp.ClientResponse | None = None  # a later round's error answer

        async def send(command: SendRound) -> Answered | Failed:
            nonlocal refused
            answer = response
            if not command.first:
                answer = await self._send(command, stream=False)
                if answer.status != 200:
                    refused = answer
                    return Failed("upstream_error")
            try:
                raw = await self.upstream.read(answer)
            except AnswerTooLarge as e:
                answer.close()
                raise garbage(e) from None
            finally:
                answer.release()
            message, round_ = self._read_answer(raw)
            meter.answered_by(message)
            answers.append(message)
            return Answered(round_)

        ended = await self.run(send)
        if refused is not None:
            return await relay(self.request, refused, self.prepared.headers, wire=self.wire)
        try:
            merged = self.wire.merge(answers, self.tool, ended.note)
        except Exception as e:
            raise garbage(e) from None
        out = CIMultiDict(headers)
        out.popall("Content-Encoding", None)
        for name, value in self.prepared.headers:
            out.add(name, value)
        out["x-compaction-read-rounds"] = str(ended.rounds)
        return web.Response(status=200, body=orjson.dumps(merged), headers=out)

    # -- streaming -----------------------------------------------------------------------

    async def stream(self, response: aiohttp.ClientResponse) -> web.StreamResponse:
        if response.status != 200:
            return await relay(self.request, response, self.prepared.headers, wire=self.wire)
        headers = client_response_headers(response.headers)
        for name, value in self.prepared.headers:
            headers.add(name, value)
        out = web.StreamResponse(status=200, headers=headers)
        await out.prepare(self.request)
        merger = self.wire.merger(self.tool)
        self.record.meter.seen_answer = True

        async def send(command: SendRound) -> Answered | Failed:
            nonlocal response  # the round being relayed (closed however the rounds end)
            if not command.first:
                response = await self._send(command, stream=True)
                if response.status != 200:
                    # Too late for a status: end the stream with the upstream's error.
                    limit = self.upstream.settings.max_answer_bytes
                    await out.write(await _error_event(response, self.wire, limit))
                    await out.write_eof()
                    return Failed("upstream_error")
            merger.begin_round()
            state = await self._relay_round(response, merger, out)
            if state is MergeState.FAILED:
                await out.write_eof()
                return Failed("upstream_error")
            if state is MergeState.OPEN:  # the upstream stream broke off
                cut_client(self.request)
                return Failed("broken")
            return Answered(merger.end_round())

        try:
            ended = await self.run(send)
            if ended.failed:
                return out
            for chunk in merger.finish(ended.note):
                await out.write(chunk)
            self.record.meter.complete = True
            await out.write_eof()
            return out
        except (aiohttp.ClientError, TimeoutError) as e:
            log.info("read_result round failed (%s); cutting the stream", type(e).__name__)
            self.record.read_outcome = "broken"
            cut_client(self.request)
            return out
        finally:
            response.close()

    async def _relay_round(
        self, response: aiohttp.ClientResponse, merger: RoundMerger, out: web.StreamResponse
    ) -> MergeState:
        decoder = SSEDecoder()
        cap = self.upstream.settings.max_line_bytes
        try:
            async for chunk in response.content.iter_any():
                events = decoder.feed(chunk)
                if decoder.buffered > cap:
                    # One event longer than the cap: nothing of it was sent; end cleanly.
                    too_long = AnswerTooLarge("an event", cap, "upstream.max_line_bytes")
                    log.warning("upstream event over %d bytes; ending the stream", cap)
                    await out.write(self.wire.stream_error(garbage(too_long)))
                    response.close()
                    return MergeState.FAILED
                # What one upstream chunk's events give goes out in one write (a write
                # per event costs a chunk frame and a send each).
                batch: list[bytes] = []
                for event in events:
                    self.record.meter.answered_by(event.raw)
                    try:
                        batch.extend(merger.feed(event))
                    except Exception as e:
                        # Too late for a 502: end the stream with the API's error event.
                        log.warning("unreadable upstream event (%s); ending the stream", e)
                        batch.append(self.wire.stream_error(garbage(e)))
                        await out.write(b"".join(batch))
                        return MergeState.FAILED
                    if merger.state is MergeState.FAILED:
                        await out.write(b"".join(batch))
                        return MergeState.FAILED
                if batch:
                    await out.write(b"".join(batch))
        finally:
            response.release()
        return merger.state


def garbage(error: Exception) -> UpstreamGarbage:
    if isinstance(error, AnswerTooLarge):
        return UpstreamGarbage(f"compaction-proxy will not read the upstream's answer: {error}")
    return UpstreamGarbage(
        f"compaction-proxy could not read the upstream's answer ({type(error).__name__})"
    )


async def _error_event(response: aiohttp.ClientResponse, wire: WireFormat, limit: int) -> bytes:
    """The upstream's error answer as an in-stream error of the wire's format."""
    try:
        payload: Any = orjson.loads(await read_bounded(response, limit))
    except (orjson.JSONDecodeError, aiohttp.ClientError):
        payload = None
    finally:
        response.release()
    return wire.upstream_stream_error(payload, response.status)
