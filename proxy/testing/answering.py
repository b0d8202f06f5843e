"""One request's answer, whatever its API and transport: the stand-in's one pipeline.

script (defaults, the API's, `x-stand-in`) -> status fault -> the body's analysis (parse,
validate, count, window, read, decide: memoised by the body's bytes, so a benchmark's
repeated request skips them) -> answer fault -> usage (the prompt cache, per credential)
-> the API's whole answer or its events. HTTP sends them (standin_http.py), the
WebSocket sends the events as frames (responses_ws.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from proxy.core.tokens import TokenCounter
from proxy.testing.api import Api, Refusal, Streamed, Whole
from proxy.testing.cache import Unit
from proxy.testing.prompt import COMPACTION, SUMMARY, TURN, Prompt
from proxy.testing.reply import Reply, Usage
from proxy.testing.scenario import scenario_reply
from proxy.testing.script import STATUS_FAULTS, Script, ScriptError, decide, parse_script
from proxy.testing.standin_http import (
    CACHE,
    COUNTER,
    OPTIONS,
    RECORD,
    SSE,
    SUMMARY_PURPOSE,
    Framing,
    RecordedRequest,
    StandInOptions,
    answer_faults,
    request_digest,
    request_id,
    retry_headers,
    scaled,
    send_json,
    send_stream,
    summariser_pace,
    take_fault,
    tenant_of,
)
from proxy.testing.summary import summarise

ANALYSIS_MEMO_SIZE = 64
INVALID = "invalid_request_error"  # (each API's `refuse` says it in its own words)


Answer = Refusal | Streamed | Whole


@dataclass(frozen=True)
class _Analysis:
    """What a request body implies, whoever sends it."""

    refusal: Refusal | None = None
    overflow: Refusal | None = None  # over the window (some APIs say so in a stream)
    body: Any = None
    total: int = 0  # the prompt's tokens, before token_scale
    units: tuple[Unit, ...] = ()
    reply: Reply | None = None


ANALYSES: web.AppKey[dict[tuple[str, bytes, str, str], _Analysis]] = web.AppKey(
    "standin_analyses", dict
)


def script_for(options: StandInOptions, api: Api, headers: Mapping[str, str]) -> Script:
    """The API's script defaults, the stand-in's over them, the request's header over all."""
    try:
        return parse_script({**api.defaults, **options.script}, headers.get("x-stand-in"))
    except TypeError as exc:  # a key of the wrong type
        raise ScriptError(str(exc)) from None


async def answer(
    app: web.Application,
    api: Api,
    headers: Mapping[str, str],
    raw: bytes,
    record: RecordedRequest,
    *,
    streaming: bool | None = None,
) -> Answer:
    """The answer to one request; `streaming` None: as the body says (a WebSocket always
    streams). The record gets the refusal's message, or the answer's kind, content and
    usage."""
    options = app[OPTIONS]
    try:
        script = script_for(options, api, headers)
    except ScriptError as exc:
        return Refusal(400, "invalid_request_error", str(exc))
    purpose = headers.get("x-compaction-proxy-purpose", "").strip().lower()
    if script.summary_fault is not None and purpose == SUMMARY_PURPOSE:
        script = dataclasses.replace(script, fault=script.summary_fault, fault_times=None)
    fault = take_fault(app, script, STATUS_FAULTS)
    if fault is not None:
        refusal = api.faults[fault]
        extra = retry_headers(script) if fault == "429" else {}
        return dataclasses.replace(refusal, headers={**refusal.headers, **extra})

    found = _analysis(app, api, raw, script, headers.get("x-stand-in", ""), purpose)
    if found.refusal is not None:
        record.error = found.refusal.message
        return found.refusal
    body = found.body
    streams = api.streaming(body) if streaming is None else streaming
    if found.overflow is not None:
        events = api.overflow(body, found.overflow) if streams else None
        if events is None:
            record.error = found.overflow.message
            return found.overflow
        return Streamed(events, script, None, None)
    reply = found.reply
    assert reply is not None
    fault = take_fault(app, script, answer_faults(streams))
    if purpose == SUMMARY_PURPOSE:
        await summariser_pace(options)

    cache = app[CACHE].account(tenant_of(headers), list(found.units), found.total)
    prompt = scaled(found.total, options)
    read = min(scaled(cache.cache_read_input_tokens, options), prompt)
    written = min(scaled(cache.cache_creation_input_tokens, options), prompt - read)
    usage = Usage(
        prompt, read, written, cache.creation_1h, reply.output_tokens, reply.reasoning_tokens
    )
    whole = api.whole(body, reply, usage)
    record.kind = reply.kind
    record.content, record.usage = api.recorded(whole)
    if streams:
        events = api.events(body, whole, script.chunk_tokens)
        return Streamed(events, script, fault, api.stream_error(events))
    return Whole(orjson.dumps(whole), script, fault, whole)


def _analysis(
    app: web.Application, api: Api, raw: bytes, script: Script, header: str, purpose: str
) -> _Analysis:
    """The body's analysis; a repeated request (benchmarks) skips parsing and counting. The
    script header is in the key: with the options it fixes the script."""
    key = (api.name, hashlib.sha256(raw).digest(), header, purpose)
    memo = app[ANALYSES]
    found = memo.pop(key, None)
    if found is None:
        found = _analyse(app, api, raw, script, header, purpose)
    memo[key] = found  # most recent last
    while len(memo) > ANALYSIS_MEMO_SIZE:
        del memo[next(iter(memo))]
    return found


def _analyse(
    app: web.Application, api: Api, raw: bytes, script: Script, header: str, purpose: str
) -> _Analysis:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return _Analysis(Refusal(400, "invalid_request_error", api.unparsable.format(error=exc)))
    refusal = api.invalid(body)
    if refusal is not None:
        return _Analysis(refusal)
    options = app[OPTIONS]
    if options.refuses_deferral and options.refuses_deferral_of(api.model(body)):
        refusal = api.deferral_refusal(body)
        if refusal is not None:
            return _Analysis(refusal)
    total = api.count(body)
    overflow = api.too_long(scaled(total, options), options.window_for(api.model(body)))
    if overflow is not None:
        return _Analysis(overflow=overflow, body=body)
    prompt = api.read(body)
    reply = _decided(app, api, body, prompt, script, header, purpose)
    return _Analysis(None, None, body, total, tuple(api.units(body)), reply)


def _decided(
    app: web.Application,
    api: Api,
    body: Any,
    prompt: Prompt,
    script: Script,
    header: str,
    purpose: str,
) -> Reply:
    """The reply: a summary when one is asked for, the scenario's when it scripts the
    request (no header), else the script's."""
    options = app[OPTIONS]
    counter: TokenCounter = app[COUNTER]
    digest = request_digest(body, api.ignored)
    kind = SUMMARY if purpose == SUMMARY_PURPOSE else (prompt.asks if prompt.asks != TURN else "")
    if options.scenario is not None and not header and not kind:
        return scenario_reply(options.scenario, prompt, counter, digest)
    layered = api.scripted(prompt)  # a scenario's keys, under the header's
    if layered:
        script = parse_script({**api.defaults, **options.script, **layered}, header or None)
    if not kind:
        return decide(prompt, script, counter, digest)
    note = api.summary_note(prompt)
    budget = prompt.summary_budget - (counter.count_text(note) + 1 if note else 0)
    text = summarise(prompt.entries, budget, counter, options.summary_loss, options.summary_keeps)
    summary = f"{text}\n{note}" if note else text
    reply = decide(prompt, script, counter, digest, summary=summary)
    return dataclasses.replace(reply, kind=COMPACTION if prompt.asks == COMPACTION else kind)


Checked = tuple[Any, Refusal | None]  # what is counted, or why the API refuses the body


async def count_tokens(
    request: web.Request,
    api: Api,
    check: Callable[[Any], Checked],
    answer: Callable[[int], dict[str, Any]],
) -> web.Response:
    """A token-counting route: the body parsed (the API's 400 when it is not JSON) and
    `check`ed, what it names counted by the API's counter (times token_scale)."""
    record = request[RECORD]
    try:
        counted, refusal = check(orjson.loads(record.body))
    except orjson.JSONDecodeError as exc:
        counted, refusal = None, Refusal(400, INVALID, api.unparsable.format(error=exc))
    if refusal is not None:
        record.error = refusal.message
        return api.refuse(refusal, request_id(request))
    return web.json_response(answer(scaled(api.count(counted), request.app[OPTIONS])))


async def serve(request: web.Request, api: Api, framing: Framing = SSE) -> web.StreamResponse:
    """An API's POST route: its gate, then the answer, sent whole or streamed."""
    refusal = api.gate(request.headers)
    out = refusal or await answer(
        request.app, api, request.headers, await request.read(), request[RECORD]
    )
    extra = api.response_headers(request.headers, out.answer if isinstance(out, Whole) else None)
    if isinstance(out, Refusal):
        response = api.refuse(out, request_id(request))
        response.headers.update(extra)
        return response
    if isinstance(out, Streamed):
        return await send_stream(request, out, framing, extra)
    return await send_json(request, out.payload, out.script, out.fault, extra)
