"""An exchange over HTTP: the body read from the client, each round POSTed upstream, the
answer relayed as it came or merged from its rounds, whole or as a stream.

Which of the two an answer is, its Content-Type says (a stream codec's, proxy/server/
transport.py: server-sent events here; another provider's framing is a codec of its
own). A merged answer: whole, the rounds' JSON answers merged into one
(`WireFormat.merge`); a stream, each round's events fed to the format's merger and
what it lets through written as it comes, then its ending (`RoundMerger.finish`). An
upstream refusal before the client's answer started is relayed as it came (status,
headers, body); after it started, it ends the stream as the API's error event. A stream
the proxy must end (the upstream went silent, an event over upstream.max_line_bytes or
one it cannot read) ends with the API's error event (`end_with_error`), as a relayed
stream does; one the upstream broke is cut.
"""

from __future__ import annotations

import contextlib
import logging
from contextlib import aclosing
from dataclasses import replace
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.config import ServerSettings
from proxy.core.commands import REFUSED, Answered, Failed
from proxy.core.errors import UpstreamError, UpstreamTimeout
from proxy.core.rounds import Ended
from proxy.core.wire_format import JSON, MergeState, RoundMerger, WireFormat
from proxy.server.bodies import BAD_JSON, Incoming, Parse, plain_parse, read_request
from proxy.server.errors import not_a_path
from proxy.server.headers import client_response_headers, upstream_request_headers
from proxy.server.prepared import redacted
from proxy.server.record import RequestRecord
from proxy.server.relay import relay
from proxy.server.transport import (
    Codecs,
    MergedHeaders,
    Outgoing,
    Refused,
    StreamCodec,
    codec_for,
    cut_client,
    end_with_error,
)
from proxy.server.upstream import AnswerTooLarge, Upstream, too_large, unreadable

log = logging.getLogger(__name__)


class HttpTransport:
    """One HTTP request's transport (`Transport[web.StreamResponse]`)."""

    def __init__(
        self,
        request: web.Request,
        upstream: Upstream,
        wire: WireFormat,
        record: RequestRecord,
        settings: ServerSettings,
        *,
        must_read: bool,
        key_checks: bool,
        bad_json: str = BAD_JSON,
        codecs: Codecs = codec_for,
        parse: Parse = plain_parse,
        path: str | None = None,
        merged_headers: MergedHeaders | None = None,
    ) -> None:
        self.request = request
        self.upstream = upstream
        self.wire = wire
        self.record = record
        self.settings = settings
        self.must_read = must_read  # budgets read the body: one they cannot is refused
        self.key_checks = key_checks  # a proxy key's: duplicate fields are refused
        self.bad_json = bad_json
        self.codecs = codecs
        self.parse = parse  # how its body is parsed (bodies.continuing: the reuse cache)
        # Where the rounds go upstream: the client's path and query unless the route says.
        self.path = request.raw_path if path is None else path
        self.merged_headers = merged_headers
        self.headers: list[tuple[str, str]] | None = None  # once sent: what goes upstream

    async def read(self) -> Incoming:
        if self.request.raw_path[:1] != "/":
            raise not_a_path(self.request.raw_path)
        return await read_request(
            self.request,
            self.settings,
            must_read=self.must_read,
            key_checks=self.key_checks,
            bad_json=self.bad_json,
            parse=self.parse,
        )

    async def answer(self, made: web.StreamResponse) -> web.StreamResponse:
        return made

    async def send(
        self, outgoing: Outgoing, body: bytes, purpose: str = "request"
    ) -> aiohttp.ClientResponse:
        """One round upstream, on the client's path and with its headers: less its
        Content-Encoding once the bytes are not the client's, asking for an uncompressed
        answer when the proxy reads it."""
        headers = self.headers
        if headers is None:  # of the client's headers, what goes upstream: theirs alone
            headers = self.headers = upstream_request_headers(self.request.headers)
        if outgoing.rewritten:
            headers = [(n, v) for n, v in headers if n.lower() != "content-encoding"]
        if outgoing.reads_answer:
            headers = [(n, v) for n, v in headers if n.lower() != "accept-encoding"]
            headers.append(("Accept-Encoding", "identity"))
        request = self.request
        response = await self.upstream.send(
            request.method,
            self.path,
            headers,
            body,
            stream=outgoing.stream,
            purpose=purpose,
            model=self.record.model,
        )
        self.record.answered(response.headers.get(self.wire.request_id_header, ""))
        return response

    async def relay(self, outgoing: Outgoing) -> web.StreamResponse:
        response = await self.send(outgoing, outgoing.body)
        if outgoing.on_refusal is not None and response.status in (400, 422):
            return await self._refusal(response, outgoing.on_refusal)
        return await self.relayed(response, outgoing)

    async def relayed(
        self, response: aiohttp.ClientResponse, outgoing: Outgoing
    ) -> web.StreamResponse:
        return await relay(
            self.request,
            response,
            self.upstream,
            self.wire,
            self.record.meter,
            outgoing.headers,
            stream=outgoing.stream,
        )

    async def _refusal(
        self, response: aiohttp.ClientResponse, take_over: Refused
    ) -> web.StreamResponse:
        """An upstream refusal the API's own step may answer instead; else relayed as it came."""
        raw = await self.upstream.read(response)
        answer = await take_over(raw)
        if answer is not None:
            return answer
        headers = client_response_headers(response.headers)
        return web.Response(
            status=response.status, reason=response.reason, headers=headers, body=raw
        )

    def merging(self, outgoing: Outgoing) -> HttpMerging:
        return HttpMerging(self, outgoing)


def _said(raw: bytes) -> str:
    """An upstream error's message, as logged (cut short)."""
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "no JSON"
    error = payload.get("error") if isinstance(payload, dict) else None
    said = error.get("message") if isinstance(error, dict) else None
    if said is None and isinstance(payload, dict):
        said = payload.get("message")  # Bedrock's shape
    return redacted(str(said))


class HttpMerging:
    """One answer made of read_result rounds, over HTTP (`Merging[web.StreamResponse]`)."""

    def __init__(self, transport: HttpTransport, outgoing: Outgoing) -> None:
        assert outgoing.tool is not None
        self.transport = transport
        self.outgoing = outgoing
        self.tool: str = outgoing.tool
        self.wire = transport.wire
        self.meter = transport.record.meter
        self.sent = 0  # rounds sent
        self.relayed: web.StreamResponse | None = None  # an upstream refusal, as it came
        self.headers: CIMultiDictProxy[str] | None = None  # the first answer's
        # A stream: its framing, its merger, and the client's stream once it started.
        self.codec: StreamCodec | None = None
        self.merger: RoundMerger | None = None
        self.out: web.StreamResponse | None = None
        self.answers: list[JSON] = []  # whole: every round's answer

    async def round(self, body: bytes) -> Answered | Failed:
        transport = self.transport
        self.sent += 1
        purpose = "request" if self.sent == 1 else "read_round"
        try:
            response = await transport.send(self.outgoing, body, purpose)
        except UpstreamError:
            if self.out is None:
                raise  # nothing was sent to the client: it gets the proxy's 502 or 504
            log.info("read_result round could not be sent; cutting the stream")
            cut_client(transport.request)
            return Failed("broken")
        if response.status == 400 and self.sent == 1 and self.outgoing.relists:
            return await self._refused_deferred(response)
        if response.status != 200:
            return await self._refused(response)
        if self.headers is None:  # the first answer: whole or a stream, as it says
            self.headers = response.headers
            self.meter.seen_answer = True  # with no usage read, it costs the reservation
            self.codec = transport.codecs(response.headers.get("Content-Type", ""))
            if self.codec is not None:  # a stream: the client's starts now
                headers = client_response_headers(response.headers)
                for name, value in self.outgoing.headers:
                    headers.add(name, value)
                self.out = web.StreamResponse(status=200, headers=headers)
                await self.out.prepare(transport.request)
        if self.out is None:
            return self._whole_round(await transport.upstream.read(response))
        return await self._stream_round(response)

    async def _refused_deferred(self, response: aiohttp.ClientResponse) -> Failed:
        """Round 1 refused with read_result deferred: not the client's answer (the rounds
        send it again listed, as round 1 still). Read, so the connection is reused."""
        raw = b""
        with contextlib.suppress(UpstreamError):
            raw = await self.transport.upstream.read(response)
        log.info("upstream refused read_result deferred (%s); sending it listed", _said(raw))
        self.sent = 0
        self.outgoing = replace(self.outgoing, relists=False)  # once: a second is relayed
        return Failed(REFUSED)

    async def _refused(self, response: aiohttp.ClientResponse) -> Failed:
        """A round the upstream refused: relayed as it came when the client's answer has
        not started, else the end of the stream, as the API's error event."""
        outcome = "upstream_error" if self.sent > 1 else ""
        if self.out is None:
            self.relayed = await self.transport.relayed(response, self.outgoing)
            return Failed(outcome)
        assert self.codec is not None
        transport = self.transport
        try:
            payload: Any = orjson.loads(await transport.upstream.read(response))
        except (orjson.JSONDecodeError, UpstreamError):
            payload = None
        error = self.wire.upstream_stream_error(payload, response.status)
        await self.out.write(self.codec.encode(error))
        await self.out.write_eof()
        return Failed(outcome)

    # -- whole ------------------------------------------------------------------------

    def _whole_round(self, raw: bytes) -> Answered:
        """One round's answer and what it asks; UpstreamGarbage (502) when the upstream
        said 200 but sent something that is not an answer of this API."""
        try:
            message = orjson.loads(raw)
            if not isinstance(message, dict):
                raise TypeError(f"a JSON {type(message).__name__}, not an object")
            round_ = self.wire.split(message, self.tool)
        except Exception as e:
            raise unreadable(e) from None
        self.meter.answered_by(message)
        self.answers.append(message)
        return Answered(round_)

    # -- a stream ---------------------------------------------------------------------

    async def _stream_round(self, response: aiohttp.ClientResponse) -> Answered | Failed:
        out, codec = self.out, self.codec
        assert out is not None and codec is not None
        if self.merger is None:  # the stream's first round: its merger, for every round
            self.merger = self.wire.merger(self.tool)
        merger = self.merger
        transport = self.transport
        merger.begin_round()
        decoder = codec.decoder()
        cap = transport.upstream.settings.max_line_bytes
        encode = codec.encode
        try:
            async with aclosing(transport.upstream.chunks(response)) as chunks:
                async for chunk in chunks:
                    events = decoder.feed(chunk)
                    if decoder.buffered > cap:
                        # One event longer than the cap: nothing of it was sent; end cleanly.
                        log.warning("upstream event over %d bytes; ending the stream", cap)
                        over = AnswerTooLarge("an event", cap, "upstream.max_line_bytes")
                        await end_with_error(out, codec, self.wire, too_large(over))
                        return Failed("upstream_error")
                    # What one upstream chunk's events give goes out in one write (a
                    # write per event costs a chunk frame and a send each).
                    batch: list[bytes] = []
                    for event in events:
                        self.meter.answered_by(event.raw)
                        try:
                            batch.extend(merger.feed(event))
                        except Exception as e:
                            # Too late for a 502: end the stream with the API's error event.
                            log.warning("unreadable upstream event (%s); ending the stream", e)
                            await out.write(b"".join(map(encode, batch)))
                            await end_with_error(out, codec, self.wire, unreadable(e))
                            return Failed("upstream_error")
                        if merger.state is MergeState.FAILED:  # the upstream's error event
                            await out.write(b"".join(map(encode, batch)))
                            await out.write_eof()
                            return Failed("upstream_error")
                    if batch:
                        await out.write(b"".join(map(encode, batch)))
        except UpstreamTimeout as silent:
            log.warning("upstream stream idle too long; ending the client stream")
            await end_with_error(out, codec, self.wire, silent)
            return Failed("upstream_error")
        except (UpstreamError, ConnectionResetError) as e:
            log.info("read_result round broke (%s); cutting the stream", type(e).__name__)
            cut_client(transport.request)
            return Failed("broken")
        if merger.state is MergeState.OPEN:  # the upstream stream ended mid-answer
            cut_client(transport.request)
            return Failed("broken")
        return Answered(merger.end_round())

    async def finish(self, ended: Ended) -> web.StreamResponse:
        if ended.failed:
            answer = self.relayed or self.out
            assert answer is not None
            return answer
        if self.out is not None:
            assert self.merger is not None and self.codec is not None
            ending = self.merger.finish(ended.note)
            await self.out.write(b"".join(map(self.codec.encode, ending)))
            self.meter.complete = True
            await self.out.write_eof()
            return self.out
        try:
            merged = self.wire.merge(self.answers, self.tool, ended.note)
        except Exception as e:
            raise unreadable(e) from None
        assert self.headers is not None
        out = CIMultiDict(client_response_headers(self.headers))
        out.popall("Content-Encoding", None)
        for name, value in self.outgoing.headers:
            out.add(name, value)
        out["x-compaction-read-rounds"] = str(ended.rounds)
        if self.transport.merged_headers is not None:
            self.transport.merged_headers(out, merged)
        return web.Response(status=200, body=orjson.dumps(merged), headers=out)
