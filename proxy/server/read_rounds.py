"""Answer the injected read_result tool inside the proxy, invisibly to the client.

When a rewritten request carried `read_result`, its upstream answer comes here instead of
the byte relay. If the model called read_result (and nothing the client must answer),
the proxy reads the slices from the store, appends the call and its results, and asks
the upstream again, up to the policy's number of rounds. The client gets one message:
in a stream, read_result blocks are held back and later rounds continue the same message
(the wire format's RoundMerger); a call mixed with client tool calls is removed from
what the client sees, so nothing is left unanswered in its history.

Every round is counted before it goes upstream: slices are shortened (the longest
first, each saying so and where to go on) until the round fits the model's window, and
the caller's budget is topped up for it. When the rounds stop while the model still
wanted to read (the round limit, the window, a budget), the message ends with one short
text saying why, so the client always gets a valid, non-empty answer. How the rounds
ended is the record's `read_outcome` (log line and metric).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy.core.errors import UpstreamGarbage
from proxy.core.offload import STOP_NOTES, ReadRequest, parse_read_args, read_slice, unknown_ref
from proxy.core.sse import SSEDecoder
from proxy.core.wire_format import JSON, MergeState, ReadCall, Round, RoundMerger, WireFormat
from proxy.server import budgets
from proxy.server.compactor import Prepared, calibrated_as
from proxy.server.headers import client_response_headers
from proxy.server.record import current_or_throwaway
from proxy.server.relay import cut_client, relay
from proxy.server.state import COMPACTOR, STORE
from proxy.server.upstream import AnswerTooLarge, Upstream, read_bounded
from proxy.store import Store, StoreUnavailable

log = logging.getLogger(__name__)

UNAVAILABLE = "The offload store is not available right now."
WINDOW_MARGIN = 0.02  # of the window kept free: the local count is an estimate
MIN_SLICE = 200  # characters a shortened slice keeps; below that the round is not sent
FIT_ATTEMPTS = 4


@dataclass(slots=True)
class Fetched:
    """One read_result call and what the store had for it."""

    call_id: str
    request: ReadRequest | None = None
    text: str | None = None  # the whole offloaded result
    error: str = ""  # what to tell the model instead

    def result(self, length: int) -> tuple[str, str, bool]:
        if self.text is None or self.request is None:
            return self.call_id, self.error, True
        asked = self.request
        cut = length < asked.length
        request = ReadRequest(asked.ref, asked.start, length) if cut else asked
        return self.call_id, read_slice(self.text, request, cut=cut), False

    @property
    def slice_length(self) -> int:
        if self.text is None or self.request is None:
            return 0
        return max(0, min(self.request.length, len(self.text) - self.request.start))


async def fetch_reads(
    reads: Iterable[ReadCall], store: Store | None, prepared: Prepared
) -> list[Fetched]:
    fetched = []
    for call in reads:
        request = parse_read_args(call.input, prepared.policy.read_length)
        if isinstance(request, str):
            fetched.append(Fetched(call.id, error=request))
            continue
        if request.ref not in prepared.refs:
            # Blobs are kept once per tenant; a conversation reads only the refs its own
            # history names (a ref copied from elsewhere reads as missing).
            fetched.append(Fetched(call.id, error=unknown_ref(request.ref)))
            continue
        if store is None:
            fetched.append(Fetched(call.id, error=UNAVAILABLE))
            continue
        try:
            text = await store.read_blob(prepared.tenant, prepared.conversation, request.ref)
        except StoreUnavailable:
            fetched.append(Fetched(call.id, error=UNAVAILABLE))
            continue
        if text is None:
            fetched.append(Fetched(call.id, error=unknown_ref(request.ref)))
            continue
        fetched.append(Fetched(call.id, request, text))
    return fetched


def shorten(lengths: list[int], chars: int) -> bool:
    """Take up to `chars` characters off the longest slices first, none below MIN_SLICE;
    False when none could give anything (the round cannot get smaller)."""
    cut = False
    for i in sorted(range(len(lengths)), key=lambda n: -lengths[n]):
        take = min(max(0, lengths[i] - MIN_SLICE), chars)
        if take > 0:
            lengths[i] -= take
            chars -= take
            cut = True
    return cut


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
        self.messages: list[JSON] = list(self.wire.messages(self.sent))
        self.rounds_used = 0
        self.max_rounds = prepared.policy.max_read_rounds
        self.record = current_or_throwaway()

    async def answer(self, response: aiohttp.ClientResponse) -> web.StreamResponse:
        if response.headers.get("Content-Type", "").startswith("text/event-stream"):
            return await self.stream(response)
        return await self.whole(response)

    async def next_body(self, round_: Round) -> bytes | str:
        """The next round's request (the reads answered, fitted to the window, the budget
        topped up), or why there is none: "limit", "window" (even the shortest slices
        would not fit) or "budget" (the top-up was refused). Any transport sends it."""
        if self.rounds_used >= self.max_rounds:
            return "limit"
        began = time.perf_counter()
        try:
            return await self._fitted(round_)
        finally:
            self.record.interception_seconds += time.perf_counter() - began

    def stop_note(self, why: str) -> str:
        """The note ending an answer whose rounds stopped for `why` (noted as the
        record's read_outcome)."""
        return self._stop_note(why)

    async def _next(self, round_: Round, stream: bool) -> aiohttp.ClientResponse | str:
        """The next round's upstream response, or why there is none (`next_body`)."""
        body = await self.next_body(round_)
        if isinstance(body, str):
            return body
        return await self.upstream.send(
            "POST",
            self.request.raw_path,
            self.upstream_headers,
            body,
            stream=stream,
            purpose="read_round",
        )

    async def _fitted(self, round_: Round) -> bytes | str:
        compactor = self.request.app[COMPACTOR]
        model = calibrated_as(self.wire, self.prepared.model)
        factor = max(1.0, compactor.calibration.factor(model, None, self.prepared.tenant))
        limit = math.floor(self.prepared.policy.window * (1 - WINDOW_MARGIN))
        fetched = await fetch_reads(round_.reads, self.store, self.prepared)
        lengths = [f.slice_length for f in fetched]
        for _ in range(FIT_ATTEMPTS):
            results = [f.result(n) for f, n in zip(fetched, lengths, strict=True)]
            messages = self.wire.continue_messages(self.messages, round_, results)
            payload = {**self.sent, **self.wire.with_history(self.sent, messages, None)}
            counted = await compactor.count(self.wire, payload, 0)
            real = math.ceil(counted.total * factor)
            if real <= limit:
                break
            # What the slices must give up, in characters at their own density.
            chars = sum(lengths)
            tokens = max(1, sum(counted.counts[len(self.messages) + 1 :]))
            over = math.ceil((real - limit) / factor)
            if not shorten(lengths, math.ceil(over * max(1.0, chars / tokens) * 1.1)):
                log.info("read_result round would not fit the window; ending the answer")
                return "window"
        else:
            return "window"
        if not await budgets.top_up(self.request, real, self.wire.max_output(payload)):
            log.info("read_result round refused by a budget; ending the answer")
            return "budget"
        self.messages = messages
        self.rounds_used += 1
        self.record.read_rounds += 1
        return self.wire.encode(self.sent, self.wire.with_history(self.sent, messages, None))

    def _stop_note(self, why: str) -> str:
        self.record.read_outcome = why
        return STOP_NOTES[why].format(rounds=self.max_rounds)

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
        note = None
        while True:
            try:
                raw = await self.upstream.read(response)
            except AnswerTooLarge as e:
                response.close()
                raise garbage(e) from None
            finally:
                response.release()
            message, round_ = self._read_answer(raw)
            meter.answered_by(message)
            answers.append(message)
            meter.round(round_.usage)
            if not round_.wants_reads_only:
                self.record.read_outcome = "complete"
                break
            following = await self._next(round_, stream=False)
            if isinstance(following, str):
                note = self._stop_note(following)
                break
            response = following
            if response.status != 200:
                self.record.read_outcome = "upstream_error"
                return await relay(self.request, response, self.prepared.headers, wire=self.wire)
        try:
            merged = self.wire.merge(answers, self.tool, note)
        except Exception as e:
            raise garbage(e) from None
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
        meter.seen_answer = True
        note = None
        try:
            while True:
                merger.begin_round()
                ended = await self._relay_round(response, merger, out)
                if ended is MergeState.FAILED:
                    self.record.read_outcome = "upstream_error"
                    await out.write_eof()
                    return out
                if ended is MergeState.OPEN:  # the upstream stream broke off
                    self.record.read_outcome = "broken"
                    cut_client(self.request)
                    return out
                round_ = merger.end_round()
                meter.round(round_.usage)
                if not round_.wants_reads_only:
                    self.record.read_outcome = "complete"
                    break
                following = await self._next(round_, stream=True)
                if isinstance(following, str):
                    note = self._stop_note(following)
                    break
                response = following
                if response.status != 200:
                    # Too late for a status: end the stream with the upstream's error.
                    self.record.read_outcome = "upstream_error"
                    await out.write(
                        await _error_event(
                            response, self.wire, self.upstream.settings.max_answer_bytes
                        )
                    )
                    await out.write_eof()
                    return out
            for chunk in merger.finish(note):
                await out.write(chunk)
            meter.complete = True
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
