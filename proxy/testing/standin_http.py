"""What every route of the stand-in upstream shares: options, the record of requests,
the HTTP shell (request ids, routing errors), credentials, faults, and sending a JSON
answer or an event stream with the script's delays and faults.

The routes themselves are each API's (api_*.py); they all answer through answering.py.
"""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import hashlib
import math
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.core.deep_json import sorted_json
from proxy.core.model_names import anthropic_name
from proxy.core.tokens import TokenCounter
from proxy.testing.api import Event, Streamed
from proxy.testing.cache import PromptCache
from proxy.testing.scenario import Scenario
from proxy.testing.script import Script

SUMMARY_PURPOSE = "summary"
MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass
class StandInOptions:
    windows: dict[str, int] = field(default_factory=lambda: {"*": 200_000})
    # The region the Bedrock stand-in's SigV4 scope must name (api_bedrock.py).
    aws_region: str = "us-east-1"
    script: dict[str, Any] = field(default_factory=dict)
    cache_ttl_seconds: float = 300
    cache_min_tokens: int = 1024
    max_body_bytes: int = MAX_BODY_BYTES
    # app[RECORDED] keeps only the newest requests (bodies included): a long benchmark or
    # a stand-in left running must not grow without bound. None keeps everything.
    max_recorded: int | None = 256
    # The real tokenizer is not ours: input counts (window check, usage, count_tokens) are
    # the project counter's times this, so the proxy's calibration has something to learn.
    token_scale: float = 1.0
    # Script requests by their content, for agents that cannot send `x-stand-in` (a
    # request carrying that header still follows it). See scenario.py.
    scenario: Scenario | None = None
    # A lossy summariser: every n-th identifier of the folded turns left out (0: none).
    summary_loss: int = 0
    # An attentive summariser: each of these strings (the facts a benchmark planted) that it
    # is shown whole is in its summary, first; one it is not shown (cut, or behind a stub)
    # is not. A model told to keep identifiers keeps those that matter, whatever its cap.
    summary_keeps: tuple[str, ...] = ()
    # A slow summariser: each summary call takes this many seconds before it answers (a
    # real model takes tens), and, when a gate is set, waits for it to open first.
    summary_delay: float = 0.0
    summary_gate: asyncio.Event | None = None
    # Models (globs, by the name the request gives or its Anthropic name) whose requests
    # are refused when they defer a tool or load one (tool search's `defer_loading`,
    # `tool_reference`), as an API or a model without tool search refuses them: a 400 in
    # the API's own error shape naming the field.
    refuses_deferral: tuple[str, ...] = ()

    def refuses_deferral_of(self, model: str) -> bool:
        names = (model, anthropic_name(model))
        return any(fnmatch.fnmatchcase(n, p) for p in self.refuses_deferral for n in names)

    def window_for(self, model: str) -> int:
        """The exact model's window, else the longest matching glob's, else 200,000."""
        if model in self.windows:
            return self.windows[model]
        matches = [p for p in self.windows if fnmatch.fnmatchcase(model, p)]
        return self.windows[max(matches, key=len)] if matches else 200_000


@dataclass
class RecordedRequest:
    method: str
    path_qs: str
    headers: dict[str, str]  # as received, original case
    body: bytes
    # "open", then "complete", "cancelled" (the client went away), "cut" (an eof fault)
    # or "error"
    outcome: str = "open"
    ended_at: float | None = None  # time.monotonic() when the stand-in was done with it
    status: int | None = None  # the response's status, once sent
    # Messages requests: what the scenario took it for (scenario.py's kinds; "summary" for
    # the proxy's summariser), the answer's blocks and the usage it reported.
    kind: str = ""
    content: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    error: str = ""  # why a Messages request was refused (the 400's message)
    # "http", or "websocket": one `response.create` frame (body: the frame as sent;
    # resolved: the request it stands for, previous_response_id resolved)
    transport: str = "http"
    resolved: bytes = b""
    started_at: float = field(default_factory=time.monotonic)  # when it arrived


RECORDED: web.AppKey[list[RecordedRequest]] = web.AppKey("standin_recorded", list)
OPTIONS: web.AppKey[StandInOptions] = web.AppKey("standin_options", StandInOptions)
CACHE: web.AppKey[PromptCache] = web.AppKey("standin_cache", PromptCache)
FAULT_COUNTS: web.AppKey[Counter[str]] = web.AppKey("standin_fault_counts", Counter)
COUNTER: web.AppKey[TokenCounter] = web.AppKey("standin_counter", TokenCounter)
REQUEST_ID: web.RequestKey[str] = web.RequestKey("standin_request_id", str)
RECORD: web.RequestKey[RecordedRequest] = web.RequestKey("standin_record", RecordedRequest)


def api_error(
    status: int, kind: str, message: str, request_id: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = {"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id}
    return web.Response(
        status=status, body=orjson.dumps(body), content_type="application/json", headers=headers
    )


def request_id(request: web.Request) -> str:
    rid = request.get(REQUEST_ID)
    if rid is None:
        rid = request[REQUEST_ID] = "req_" + secrets.token_hex(12)
    return rid


@web.middleware
async def api_shell(request: web.Request, handler: Any) -> web.StreamResponse:
    """Records the request, maps routing errors to the API's shape, notes the outcome."""
    rid = request_id(request)
    record = recorded(request, request.method, b"")
    request[RECORD] = record
    try:
        try:
            record.body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return api_error(413, "request_too_large", "Request exceeds the maximum size", rid)
        try:
            response: web.StreamResponse = await handler(request)
        except web.HTTPNotFound:
            response = api_error(404, "not_found_error", "Not Found", rid)
        except web.HTTPMethodNotAllowed:
            response = api_error(405, "invalid_request_error", "Method Not Allowed", rid)
        if record.outcome == "open":
            record.outcome = "complete"
        record.status = response.status
        return response
    except (asyncio.CancelledError, ConnectionResetError):  # the client went away
        record.outcome = "cancelled"
        raise
    except Exception:
        if record.outcome == "open":
            record.outcome = "error"
        raise
    finally:
        record.ended_at = time.monotonic()


def recorded(request: web.Request, method: str, body: bytes) -> RecordedRequest:
    """A new record of a request (or a WebSocket frame), the oldest dropped past the limit."""
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in request.raw_headers}
    record = RecordedRequest(method, request.path_qs, headers, body)
    kept = request.app[RECORDED]
    kept.append(record)
    limit = request.app[OPTIONS].max_recorded
    if limit is not None and len(kept) > limit:
        del kept[: len(kept) - limit]
    return record


async def add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.setdefault("request-id", request_id(request))


def credential(headers: Mapping[str, str]) -> str | None:
    """The API key (`x-api-key`, Gemini's `x-goog-api-key`) or Bearer token a request
    carries."""
    key = headers.get("x-api-key", "").strip() or headers.get("x-goog-api-key", "").strip()
    if key:
        return key
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer " and auth[7:].strip():
        return auth[7:].strip()
    return None


def tenant_of(headers: Mapping[str, str]) -> str:
    """Whose prompt cache a request reads: a hash of its credential."""
    return hashlib.sha256((credential(headers) or "").encode()).hexdigest()[:32]


def request_digest(body: dict[str, Any], ignored: tuple[str, ...]) -> str:
    """The hash answers derive from: streamed or not, the same request gets the same one."""
    same = {k: v for k, v in body.items() if k not in ignored}
    try:
        return hashlib.sha256(orjson.dumps(same, option=orjson.OPT_SORT_KEYS)).hexdigest()
    except TypeError:  # nested deeper than orjson writes (255 levels)
        return hashlib.sha256(sorted_json(same)).hexdigest()


def retry_headers(script: Script) -> dict[str, str]:
    """What a 429 fault says about when to come back."""
    seconds = max(1, -(-int(script.retry_after_ms) // 1000))
    return {"retry-after": str(seconds), "retry-after-ms": f"{script.retry_after_ms:g}"}


def take_fault(app: web.Application, script: Script, kinds: tuple[str, ...]) -> str | None:
    """The script's fault if it is of these kinds and its `fault_times` is not used up."""
    fault = script.fault
    if fault not in kinds:
        return None
    seen = app[FAULT_COUNTS][fault]
    app[FAULT_COUNTS][fault] += 1
    if script.fault_times is not None and seen >= script.fault_times:
        return None
    return fault


def answer_faults(streaming: bool) -> tuple[str, ...]:
    """The faults that strike once the answer is under way."""
    return ("stream_error", "eof", "eof_mid", "stall") if streaming else ("eof", "stall")


def scaled(tokens: int, options: StandInOptions) -> int:
    return tokens if options.token_scale == 1.0 else math.ceil(tokens * options.token_scale)


async def send_json(
    request: web.Request,
    payload: bytes,
    script: Script,
    fault: str | None,
    headers: Mapping[str, str] | None = None,
) -> web.StreamResponse:
    """A JSON answer; an `eof` fault cuts it halfway, a `stall` holds it back first."""
    if fault is None:
        return web.Response(body=payload, content_type="application/json", headers=headers)
    response = web.StreamResponse(headers={**(headers or {}), "Content-Type": "application/json"})
    response.content_length = len(payload)
    await response.prepare(request)
    if fault == "eof":
        await response.write(payload[: len(payload) // 2])
        cut(request)
        return response
    await stall(request, script.stall_seconds)
    await response.write(payload)
    await response.write_eof()
    return response


def cut(request: web.Request) -> None:
    """End the connection mid-body (what a dropped upstream looks like)."""
    record = request.get(RECORD)
    if record is not None:
        record.outcome = "cut"
    if request.transport is not None:
        request.transport.close()


async def stall(request: web.Request, seconds: float) -> None:
    """Send nothing for a while; stop early if the client has gone."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        transport = request.transport
        if transport is None or transport.is_closing():
            record = request.get(RECORD)
            if record is not None:
                record.outcome = "cancelled"
            raise ConnectionResetError("the client went away during a stall")
        await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


_CUTS = ("stream_error", "eof", "eof_mid")  # faults that stop a stream's events


async def paced(
    events: Iterable[Event],
    script: Script,
    fault: str | None,
    stall: Callable[[float], Awaitable[None]],
) -> AsyncIterator[Event]:
    """The events to send, when to send them: the script's delay between deltas, a `stall`
    after the start; a `stream_error` or `eof` fault stops them after the first delta (or
    before the end, when there is none). The caller sends what follows the fault."""
    deltas = 0
    for event in events:
        if event.kind == "delta":
            if deltas and script.token_delay:
                await asyncio.sleep(script.token_delay)
            deltas += 1
        elif event.kind == "end" and fault in _CUTS:
            return  # the answer had no delta to cut after
        yield event
        if event.kind == "start" and fault == "stall":
            await stall(script.stall_seconds)
        if event.kind == "delta" and deltas == 1 and fault in _CUTS:
            return


@dataclass(frozen=True)
class Framing:
    """How a transport writes events: SSE here; AWS's event stream is another; a JSON
    array (Gemini's) has an opening, a separator between events and a closing."""

    content_type: str
    frame: Callable[[Event], bytes]
    opening: bytes = b""
    separator: bytes = b""
    closing: bytes = b""


SSE = Framing("text/event-stream; charset=utf-8", Event.sse)


async def send_stream(
    request: web.Request,
    out: Streamed,
    framing: Framing = SSE,
    headers: Mapping[str, str] | None = None,
) -> web.StreamResponse:
    """The events, framed and paced; then a `stream_error` fault's event, or an `eof` cut."""
    response = web.StreamResponse(
        headers={**(headers or {}), "Content-Type": framing.content_type,
                 "Cache-Control": "no-cache"}
    )  # fmt: skip
    await response.prepare(request)
    fault = out.fault
    sent = False  # an event went out (after the opening)

    async def write(event: Event) -> None:
        nonlocal sent
        await response.write(
            (framing.separator if sent else framing.opening) + framing.frame(event)
        )
        sent = True

    async for event in paced(out.events, out.script, fault, functools.partial(stall, request)):
        await write(event)
    if fault == "stream_error" and out.fault_event is not None:
        await write(out.fault_event)
    elif fault == "eof":
        cut(request)
        return response
    elif fault == "eof_mid":  # half of the answer's last event, then the cut
        last = framing.frame(out.events[-1])
        await response.write(framing.separator if sent else framing.opening)
        await response.write(last[: len(last) // 2])
        cut(request)
        return response
    if framing.closing:
        await response.write(framing.closing if sent else framing.opening + framing.closing)
    await response.write_eof()
    return response


async def summariser_pace(options: StandInOptions) -> None:
    """Hold a summary call as long as the options' summariser takes."""
    if options.summary_gate is not None:
        await options.summary_gate.wait()
    if options.summary_delay > 0:
        await asyncio.sleep(options.summary_delay)
