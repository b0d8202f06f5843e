"""Answer the injected read_result tool inside the proxy, invisibly to the client.

When a rewritten request carried `read_result`, its upstream answer comes here instead of
the byte relay. If the model called read_result (and nothing the client must answer),
the proxy reads the slices from the store, appends the call and its results, and asks
the upstream again, up to the policy's number of rounds. The client gets one message:
in a stream, read_result blocks are held back and later rounds continue the same message
(the wire format's RoundMerger); a call mixed with client tool calls is removed from
what the client sees, so nothing is left unanswered in its history.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy.core.offload import parse_read_args, read_slice, unknown_ref
from proxy.core.sse import SSEDecoder
from proxy.core.wire_format import JSON, MergeState, ReadCall, Round, RoundMerger, WireFormat
from proxy.server import budgets
from proxy.server.compactor import Prepared
from proxy.server.headers import client_response_headers
from proxy.server.record import detached
from proxy.server.relay import cut_client, relay
from proxy.server.state import COMPACTOR, STORE
from proxy.server.upstream import Upstream
from proxy.store import Store, StoreUnavailable

log = logging.getLogger(__name__)

UNAVAILABLE = "The offload store is not available right now."


async def answer_reads(
    reads: Iterable[ReadCall], store: Store | None, prepared: Prepared
) -> list[tuple[str, str, bool]]:
    """(call id, text, is_error) for each read_result call."""
    results = []
    for call in reads:
        request = parse_read_args(call.input, prepared.policy.read_length)
        if isinstance(request, str):
            results.append((call.id, request, True))
            continue
        if store is None:
            results.append((call.id, UNAVAILABLE, True))
            continue
        try:
            data = await store.get_blob(prepared.tenant, prepared.conversation, request.ref)
        except StoreUnavailable:
            results.append((call.id, UNAVAILABLE, True))
            continue
        if data is None:
            results.append((call.id, unknown_ref(request.ref), True))
            continue
        results.append((call.id, read_slice(data.decode("utf-8", "replace"), request), False))
    return results


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
        self.request = request
        self.prepared = prepared
        self.tool: str = prepared.tool
        self.wire = wire
        self.upstream = upstream
        self.upstream_headers = upstream_headers
        self.store: Store | None = request.app[STORE].store
        self.sent: dict[str, Any] = dict(prepared.sent)
        self.messages: list[JSON] = wire.messages(self.sent)
        self.rounds_used = 0
        self.record = detached()

    async def answer(self, response: aiohttp.ClientResponse) -> web.StreamResponse:
        if response.headers.get("Content-Type", "").startswith("text/event-stream"):
            return await self.stream(response)
        return await self.whole(response)

    async def _ask_again(self, round_: Round, stream: bool) -> aiohttp.ClientResponse | None:
        """The next round's upstream response; None when the caller's budget cannot
        hold another round (the rounds stop, as at `max_read_rounds`)."""
        began = time.perf_counter()
        results = await answer_reads(round_.reads, self.store, self.prepared)
        messages = self.wire.continue_messages(self.messages, round_, results)
        history = self.wire.with_history(self.sent, messages, None)
        payload = {**self.sent, **history}
        try:
            if budgets.applies(self.request):
                compactor = self.request.app[COMPACTOR]
                counted = await compactor.count(self.wire, payload, 0)
                factor = compactor.calibration.factor(self.prepared.model, None)
                estimate = int(counted.total * max(1.0, factor) + 0.999)
                if not await budgets.top_up(self.request, estimate, self.wire.max_output(payload)):
                    log.info("read_result round refused by a budget; ending the answer")
                    return None
            self.messages = messages
            self.rounds_used += 1
            self.record.read_rounds += 1
            body = self.wire.encode(self.sent, history)
        finally:
            self.record.interception_seconds += time.perf_counter() - began
        return await self.upstream.send(
            "POST", self.request.raw_path, self.upstream_headers, body, stream=stream
        )

    # -- not streaming -------------------------------------------------------------------

    async def whole(self, response: aiohttp.ClientResponse) -> web.StreamResponse:
        if response.status != 200:
            return await relay(self.request, response, self.prepared.headers, wire=self.wire)
        headers = client_response_headers(response.headers)
        answers: list[JSON] = []
        meter = self.record.meter
        while True:
            try:
                raw = await response.read()
                message = orjson.loads(raw)
            finally:
                response.release()
            answers.append(message)
            round_ = self.wire.split(message, self.tool)
            meter.round(round_.usage)
            if (
                not round_.wants_reads_only
                or self.rounds_used >= self.prepared.policy.max_read_rounds
            ):
                break
            next_response = await self._ask_again(round_, stream=False)
            if next_response is None:
                break
            response = next_response
            if response.status != 200:
                return await relay(self.request, response, self.prepared.headers, wire=self.wire)
        merged = self.wire.merge(answers, self.tool)
        out = CIMultiDict(headers)
        out.popall("Content-Encoding", None)
        for name, value in self.prepared.headers:
            out.add(name, value)
        out["x-compaction-read-rounds"] = str(self.rounds_used)
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
        meter = self.record.meter
        try:
            while True:
                merger.begin_round()
                ended = await self._relay_round(response, merger, out)
                if ended is MergeState.FAILED:
                    await out.write_eof()
                    return out
                if ended is MergeState.OPEN:  # the upstream stream broke off
                    cut_client(self.request)
                    return out
                round_ = merger.end_round()
                meter.round(round_.usage)
                more = round_.wants_reads_only
                if not more or self.rounds_used >= self.prepared.policy.max_read_rounds:
                    break
                next_response = await self._ask_again(round_, stream=True)
                if next_response is None:
                    break
                response = next_response
                if response.status != 200:
                    # Too late for a status: end the stream with the upstream's error.
                    await out.write(await _error_event(response, self.wire))
                    await out.write_eof()
                    return out
            for chunk in merger.finish():
                await out.write(chunk)
            meter.complete = True
            await out.write_eof()
            return out
        except (aiohttp.ClientError, TimeoutError) as e:
            log.info("read_result round failed (%s); cutting the stream", type(e).__name__)
            cut_client(self.request)
            return out
        finally:
            response.close()

    async def _relay_round(
        self, response: aiohttp.ClientResponse, merger: RoundMerger, out: web.StreamResponse
    ) -> MergeState:
        decoder = SSEDecoder()
        try:
            async for chunk in response.content.iter_any():
                for event in decoder.feed(chunk):
                    for piece in merger.feed(event):
                        await out.write(piece)
                    if merger.state is MergeState.FAILED:
                        return MergeState.FAILED
        finally:
            response.release()
        return merger.state


async def _error_event(response: aiohttp.ClientResponse, wire: WireFormat) -> bytes:
    """The upstream's error answer as an in-stream error of the wire's format."""
    try:
        payload: Any = orjson.loads(await response.read())
    except (orjson.JSONDecodeError, aiohttp.ClientError):
        payload = None
    finally:
        response.release()
    return wire.upstream_stream_error(payload, response.status)
