"""Answer the injected read_result tool inside the proxy, invisibly to the client.

When a rewritten request carried `read_result`, its upstream answer comes here instead of
the byte relay. If the model called read_result (and nothing the client must answer),
the proxy reads the slices from the store, appends the call and its results, and asks
the upstream again, up to the policy's number of rounds. The client gets one message:
in a stream, read_result blocks are held back and later rounds continue the same message
(see proxy/wire/anthropic_rounds.py, and openai_rounds.py for Chat; the request's Wire
picks them); a call mixed with client tool calls is removed from what the client sees,
so nothing is left unanswered in its history.
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
from proxy.server import budgets, charges, observe
from proxy.server.compaction import Compactor, Interception
from proxy.server.headers import client_response_headers
from proxy.server.relay import cut_client, relay
from proxy.server.upstream import Upstream
from proxy.server.wires import Wire
from proxy.store import Store, StoreUnavailable
from proxy.wire.anthropic import encode_request

log = logging.getLogger(__name__)


async def answer_reads(
    reads: Iterable[dict[str, Any]], store: Store | None, interception: Interception
) -> list[tuple[str, str, bool]]:
    """(tool_use_id, text, is_error) for each read_result call."""
    results = []
    for call in reads:
        call_id = str(call.get("id", ""))
        request = parse_read_args(call.get("input"), interception.policy.read_length)
        if isinstance(request, str):
            results.append((call_id, request, True))
            continue
        if store is None:
            results.append((call_id, "The offload store is not available right now.", True))
            continue
        try:
            data = await store.get_blob(interception.tenant, interception.conversation, request.ref)
        except StoreUnavailable:
            results.append((call_id, "The offload store is not available right now.", True))
            continue
        if data is None:
            results.append((call_id, unknown_ref(request.ref), True))
            continue
        results.append((call_id, read_slice(data.decode("utf-8", "replace"), request), False))
    return results


class ReadLoop:
    """One client request's rounds against the upstream."""

    def __init__(
        self,
        request: web.Request,
        interception: Interception,
        upstream: Upstream,
        store: Store | None,
        compactor: Compactor,
        extra_headers: Iterable[tuple[str, str]],
        upstream_headers: list[tuple[str, str]],
        estimate: int,
    ) -> None:
        self.request = request
        self.i = interception
        self.upstream = upstream
        self.store = store
        self.compactor = compactor
        self.extra_headers = list(extra_headers)
        self.upstream_headers = upstream_headers
        self.estimate = estimate
        self.messages: list[Any] = list(interception.body["messages"])
        self.rounds_used = 0

    async def _ask_again(self, round_: Any, stream: bool) -> aiohttp.ClientResponse | None:
        """The next round's upstream response; None when the caller's budget cannot
        hold another round (the rounds stop, as at `max_read_rounds`)."""
        began = time.perf_counter()
        results = await answer_reads(round_.reads, self.store, self.i)
        messages = self.i.wire.continue_messages(self.messages, round_, results)
        payload = {**self.i.body, "messages": messages}
        if not await budgets.top_up(
            self.request, self.compactor, self.i.wire.format, payload, self.store
        ):
            log.info("read_result round refused by a budget; ending the answer")
            observe.interception(time.perf_counter() - began)
            return None
        self.messages = messages
        self.rounds_used += 1
        body = encode_request(self.i.body, messages=self.messages)
        observe.read_round()
        observe.interception(time.perf_counter() - began)
        return await self.upstream.send(
            "POST", self.request.raw_path, self.upstream_headers, body, stream=stream
        )

    def _calibrate(self, usage: dict[str, Any]) -> None:
        if self.rounds_used == 0:  # later rounds carry text we did not estimate
            self.compactor.record_usage(
                str(self.i.body.get("model", "")),
                self.estimate,
                self.i.wire.usage_input(usage),
                self.store,
            )

    # -- not streaming -------------------------------------------------------------------

    async def whole(self, response: aiohttp.ClientResponse) -> web.StreamResponse:
        if response.status != 200:
            return await relay(self.request, response, self.extra_headers)
        headers = client_response_headers(response.headers)
        answers: list[dict[str, Any]] = []
        while True:
            try:
                raw = await response.read()
                charges.upstream_body(raw)
                message = orjson.loads(raw)
            finally:
                response.release()
            answers.append(message)
            round_ = self.i.wire.split(message, self.i.tool)
            observe.add_usage(round_.usage)
            if not answers[1:]:
                self._calibrate(round_.usage)
            if not round_.wants_reads_only or self.rounds_used >= self.i.policy.max_read_rounds:
                break
            next_response = await self._ask_again(round_, stream=False)
            if next_response is None:
                break
            response = next_response
            if response.status != 200:
                return await relay(self.request, response, self.extra_headers)
        merged = self.i.wire.merge(answers, self.i.tool)
        out = CIMultiDict(headers)
        out.popall("Content-Encoding", None)
        for name, value in self.extra_headers:
            out.add(name, value)
        out["x-compaction-read-rounds"] = str(self.rounds_used)
        return web.Response(status=200, body=orjson.dumps(merged), headers=out)

    # -- streaming -----------------------------------------------------------------------

    async def stream(self, response: aiohttp.ClientResponse) -> web.StreamResponse:
        if response.status != 200:
            return await relay(self.request, response, self.extra_headers)
        headers = client_response_headers(response.headers)
        for name, value in self.extra_headers:
            headers.add(name, value)
        out = web.StreamResponse(status=200, headers=headers)
        await out.prepare(self.request)
        merger = self.i.wire.merger(self.i.tool)
        try:
            while True:
                merger.begin_round()
                ended = await self._relay_round(response, merger, out)
                if ended == "error":
                    await out.write_eof()
                    return out
                if ended == "cut":
                    cut_client(self.request)
                    return out
                round_ = merger.end_round()
                observe.add_usage(round_.usage)
                if merger.rounds == 1:
                    self._calibrate(round_.usage)
                more = round_.wants_reads_only
                if not more or self.rounds_used >= self.i.policy.max_read_rounds:
                    break
                next_response = await self._ask_again(round_, stream=True)
                if next_response is None:
                    break
                response = next_response
                if response.status != 200:
                    # Too late for a status: end the stream with the upstream's error.
                    await out.write(await _error_event(response, self.i.wire))
                    await out.write_eof()
                    return out
            for chunk in merger.finish():
                await out.write(chunk)
            await out.write_eof()
            return out
        except (aiohttp.ClientError, TimeoutError) as e:
            log.info("read_result round failed (%s); cutting the stream", type(e).__name__)
            cut_client(self.request)
            return out
        finally:
            response.close()

    async def _relay_round(
        self, response: aiohttp.ClientResponse, merger: Any, out: web.StreamResponse
    ) -> str:
        decoder = SSEDecoder()
        stopped = False
        round_event = self.i.wire.round_event
        try:
            async for chunk in response.content.iter_any():
                charges.upstream_chunk(chunk)
                for event in decoder.feed(chunk):
                    for piece in merger.feed(event):
                        await out.write(piece)
                    seen = round_event(merger, event)
                    if seen == "error":
                        return "error"
                    stopped = stopped or seen == "stop"
        finally:
            response.release()
        return "done" if stopped else "cut"


async def _error_event(response: aiohttp.ClientResponse, wire: Wire) -> bytes:
    """The upstream's error answer as an in-stream error of the wire's format."""
    try:
        payload: Any = orjson.loads(await response.read())
    except (orjson.JSONDecodeError, aiohttp.ClientError):
        payload = None
    finally:
        response.release()
    return wire.error_event(payload, response.status)
