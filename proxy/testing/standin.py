"""The stand-in upstream: a local, strict imitation of the Anthropic Messages API.

Routes: `POST /v1/messages` (JSON or SSE stream, `?beta=true` accepted),
`POST /v1/messages/count_tokens`, `GET /v1/models`, `GET /v1/models/{id}`. Anything else
is a 404 in the API's error shape. Every request needs a credential (`x-api-key` or
`authorization: Bearer`) and `anthropic-version`; every response carries `request-id`.

Requests are validated by validate.py, usage comes from the project's token counter and
the prompt-cache model of cache.py, answers follow script.py (and summary.py for requests
marked `x-compaction-proxy-purpose: summary`). Answers are deterministic: ids derive from
a hash of the request body, so the same request gets the same message.

Every request is appended to `app[RECORDED]` when it arrives, with its outcome when done.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import signal
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.core.tokens import default_counter
from proxy.testing.cache import PromptCache, Unit, prompt_units
from proxy.testing.chat_standin import add_routes
from proxy.testing.responses_standin import add_routes as add_responses_routes
from proxy.testing.responses_ws import add_routes as add_responses_ws_routes
from proxy.testing.scenario import SUMMARY, scenario_answer
from proxy.testing.script import (
    STATUS_FAULTS,
    Answer,
    Script,
    ScriptError,
    plan_answer,
)
from proxy.testing.standin_http import (
    CACHE,
    COUNTER,
    FAULT_COUNTS,
    MAX_BODY_BYTES,
    OPTIONS,
    RECORD,
    RECORDED,
    REQUEST_ID,
    SUMMARY_PURPOSE,
    RecordedRequest,
    StandInOptions,
    _add_request_id,
    _api_shell,
    _credential,
    _cut,
    _gate,
    _invalid,
    _json_body,
    _request_id,
    _scaled,
    _sse,
    _stall,
    _take_fault,
    _tenant,
    _text_pieces,
    answer_faults,
    api_error,
    request_digest,
    retry_headers,
    script_for,
    send_json,
    send_stream,
    summariser_pace,
)
from proxy.testing.summary import summarise
from proxy.wire.anthropic_validation import (
    validate_count_tokens_request,
    validate_messages_request,
    window_error,
)

JSON_PIECE_CHARS = 24  # characters of partial_json per input_json_delta


MODELS = (
    ("claude-opus-4-5-20251101", "Claude Opus 4.5", "2025-11-01T00:00:00Z"),
    ("claude-sonnet-4-5-20250929", "Claude Sonnet 4.5", "2025-09-29T00:00:00Z"),
    ("claude-haiku-4-5-20251001", "Claude Haiku 4.5", "2025-10-01T00:00:00Z"),
)


_FAULT_STATUS = {
    "429": (429, "rate_limit_error", "Number of request tokens has exceeded your rate limit."),
    "529": (529, "overloaded_error", "Overloaded"),
    "500": (500, "api_error", "Internal server error"),
}


ANALYSES: web.AppKey[dict[tuple[bytes, str, str], _Analysis]] = web.AppKey("standin_analyses", dict)


ANALYSIS_MEMO_SIZE = 64


async def handle_models(request: web.Request) -> web.Response:
    error = _gate(request)
    if error:
        return error
    data = [_model(*m) for m in MODELS]
    return web.json_response(
        {"data": data, "has_more": False, "first_id": data[0]["id"], "last_id": data[-1]["id"]},
        dumps=lambda v: orjson.dumps(v).decode(),
    )


async def handle_model(request: web.Request) -> web.Response:
    error = _gate(request)
    if error:
        return error
    model_id = request.match_info["model_id"]
    for m in MODELS:
        if m[0] == model_id:
            return web.json_response(_model(*m), dumps=lambda v: orjson.dumps(v).decode())
    return api_error(404, "not_found_error", f"model: {model_id}", _request_id(request))


def _model(model_id: str, name: str, created: str) -> dict[str, str]:
    return {"type": "model", "id": model_id, "display_name": name, "created_at": created}


async def handle_count_tokens(request: web.Request) -> web.Response:
    error = _gate(request)
    if error:
        return error
    body, error = await _json_body(request)
    if error:
        return error
    message = validate_count_tokens_request(body)
    if message:
        return _invalid(request, message)
    tokens = _scaled(request.app[COUNTER].count_request(body), request.app[OPTIONS])
    return web.Response(
        body=orjson.dumps({"input_tokens": tokens}), content_type="application/json"
    )


@dataclass(frozen=True)
class _Analysis:
    """What a request body implies, whoever sends it: memoised by the body's bytes."""

    error: str | None
    streaming: bool = False
    total: int = 0
    units: tuple[Unit, ...] = ()
    head: dict[str, Any] = field(default_factory=dict)
    answer: Answer | None = None
    kind: str = ""


def _analyse(
    raw: bytes, script: Script, purpose: str, scripted: bool, app: web.Application
) -> _Analysis:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return _Analysis(f"There was an error parsing the body: {exc}")
    message = validate_messages_request(body)
    if message:
        return _Analysis(message)
    counter = app[COUNTER]
    total = counter.count_request(body)
    message = window_error(_scaled(total, app[OPTIONS]), app[OPTIONS].window_for(body["model"]))
    if message:
        return _Analysis(message)
    digest = request_digest(body, ("stream",))
    scenario = app[OPTIONS].scenario
    kind = ""
    if purpose == SUMMARY_PURPOSE:
        kind = SUMMARY
        answer = plan_answer(
            body,
            script,
            counter,
            digest[24:],
            text_override=summarise(body, counter, app[OPTIONS].summary_loss),
        )
    elif scenario is not None and not scripted:
        kind, answer = scenario_answer(scenario, body, counter, digest[24:])
    else:
        answer = plan_answer(body, script, counter, digest[24:])
    head = {"id": f"msg_{digest[:24]}", "type": "message", "role": "assistant"}
    head["model"] = body["model"]
    units = tuple(prompt_units(body, counter))
    return _Analysis(None, bool(body.get("stream")), total, units, head, answer, kind)


def _analysis(request: web.Request, raw: bytes, script: Script) -> _Analysis:
    """The body's analysis; a repeated request (benchmarks) skips parsing and counting."""
    purpose = request.headers.get("x-compaction-proxy-purpose", "").strip().lower()
    header = request.headers.get("x-stand-in", "")  # with the options, it fixes the script
    key = (hashlib.blake2b(raw, digest_size=16).digest(), header, purpose)
    memo = request.app[ANALYSES]
    found = memo.pop(key, None)
    if found is None:
        found = _analyse(raw, script, purpose, bool(header), request.app)
    memo[key] = found  # most recent last
    while len(memo) > ANALYSIS_MEMO_SIZE:
        del memo[next(iter(memo))]
    return found


async def handle_messages(request: web.Request) -> web.StreamResponse:
    error = _gate(request)
    if error:
        return error
    app = request.app
    try:
        script = script_for(request)
    except ScriptError as exc:
        return _invalid(request, str(exc))

    purpose = request.headers.get("x-compaction-proxy-purpose", "").strip().lower()
    if script.summary_fault is not None and purpose == SUMMARY_PURPOSE:
        script = dataclasses.replace(script, fault=script.summary_fault, fault_times=None)
    fault = _take_fault(app, script, STATUS_FAULTS)
    if fault is not None:
        status, kind, text = _FAULT_STATUS[fault]
        retry = retry_headers(script) if fault == "429" else {}
        return api_error(status, kind, text, _request_id(request), retry)

    analysis = _analysis(request, await request.read(), script)
    if analysis.error is not None or analysis.answer is None:
        request[RECORD].error = analysis.error or ""
        return _invalid(request, analysis.error or "")
    fault = _take_fault(app, script, answer_faults(analysis.streaming))
    if analysis.kind == SUMMARY:
        await summariser_pace(app[OPTIONS])
    tenant = _tenant(request)
    usage = app[CACHE].account(tenant, list(analysis.units), analysis.total).as_usage()
    if app[OPTIONS].token_scale != 1.0:
        for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
            usage[key] = _scaled(usage[key], app[OPTIONS])
    record = request[RECORD]
    record.kind, record.content = analysis.kind, analysis.answer.content
    record.usage = _final_usage(usage, analysis.answer)
    if analysis.streaming:
        events = _events(analysis.head, usage, analysis.answer, script)
        return await send_stream(request, events, script, fault, STREAM_ERROR_EVENT)
    payload = _message_bytes(analysis.head, usage, analysis.answer)
    return await send_json(request, payload, script, fault)


def _final_usage(usage: dict[str, Any], answer: Answer) -> dict[str, Any]:
    return {**usage, "output_tokens": answer.output_tokens, "service_tier": "standard"}


def _message_bytes(head: dict[str, Any], usage: dict[str, Any], answer: Answer) -> bytes:
    message = {
        **head,
        "content": answer.content,
        "stop_reason": answer.stop_reason,
        "stop_sequence": None,
        "usage": _final_usage(usage, answer),
    }
    return orjson.dumps(message)


def _delta(index: int, delta: dict[str, Any]) -> tuple[str, bytes]:
    return "delta", _sse(
        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
    )


def _block_events(index: int, block: dict[str, Any], script: Script) -> Iterator[tuple[str, bytes]]:
    kind = block["type"]
    if kind == "text":
        start: dict[str, Any] = {"type": "text", "text": ""}
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
    else:
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
    yield (
        "block",
        _sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": start},
        ),
    )
    if kind == "text":
        for piece in _text_pieces(block["text"], script.chunk_tokens):
            yield _delta(index, {"type": "text_delta", "text": piece})
    elif kind == "thinking":
        for piece in _text_pieces(block["thinking"], script.chunk_tokens):
            yield _delta(index, {"type": "thinking_delta", "thinking": piece})
        yield _delta(index, {"type": "signature_delta", "signature": block["signature"]})
    else:  # tool_use: the input arrives as JSON text in pieces, the first one empty
        text = orjson.dumps(block["input"]).decode()
        yield _delta(index, {"type": "input_json_delta", "partial_json": ""})
        for i in range(0, len(text), JSON_PIECE_CHARS):
            piece = text[i : i + JSON_PIECE_CHARS]
            yield _delta(index, {"type": "input_json_delta", "partial_json": piece})
    yield "block", _sse("content_block_stop", {"type": "content_block_stop", "index": index})


def _events(
    head: dict[str, Any], usage: dict[str, Any], answer: Answer, script: Script
) -> Iterator[tuple[str, bytes]]:
    """(kind, bytes) of the stream; kind marks where faults and delays apply."""
    start = {**head, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**usage, "output_tokens": 1, "service_tier": "standard"}
    yield "start", _sse("message_start", {"type": "message_start", "message": start})
    yield "ping", _sse("ping", {"type": "ping"})
    for index, block in enumerate(answer.content):
        yield from _block_events(index, block, script)
    yield "ping", _sse("ping", {"type": "ping"})
    final = _final_usage(usage, answer)
    del final["service_tier"], final["cache_creation"]
    delta = {"stop_reason": answer.stop_reason, "stop_sequence": None}
    yield "end", _sse("message_delta", {"type": "message_delta", "delta": delta, "usage": final})
    yield "end", _sse("message_stop", {"type": "message_stop"})


STREAM_ERROR_EVENT = _sse(
    "error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
)


def create_app(options: StandInOptions | None = None) -> web.Application:
    options = options or StandInOptions()
    app = web.Application(middlewares=[_api_shell], client_max_size=options.max_body_bytes)
    app[OPTIONS] = options
    app[RECORDED] = []
    app[CACHE] = PromptCache(options.cache_ttl_seconds, options.cache_min_tokens)
    app[FAULT_COUNTS] = Counter()
    app[COUNTER] = default_counter()
    app[ANALYSES] = {}
    app.on_response_prepare.append(_add_request_id)
    app.router.add_post("/v1/messages", handle_messages)
    app.router.add_post("/v1/messages/count_tokens", handle_count_tokens)
    app.router.add_get("/v1/models", handle_models)
    app.router.add_get("/v1/models/{model_id}", handle_model)

    add_routes(app)  # POST /v1/chat/completions
    add_responses_routes(app)  # POST /v1/responses
    add_responses_ws_routes(app)  # GET /v1/responses (WebSocket: responses_ws.py)
    return app


async def start(host: str, port: int, options: StandInOptions) -> tuple[web.AppRunner, str]:
    """Listen on host:port (0: any free port); the runner (cleanup() stops it) and the
    URL. An address that cannot be listened on raises OSError, with nothing left open."""
    runner = web.AppRunner(create_app(options), handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_host, bound_port = runner.addresses[0][:2]
    bound_host = f"[{bound_host}]" if ":" in bound_host else bound_host
    return runner, f"http://{bound_host}:{bound_port}"


async def _serve(host: str, port: int, options: StandInOptions) -> None:
    runner, url = await start(host, port, options)
    print(
        f"stand-in upstream (Messages, Chat Completions, Responses) listening on {url}",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def run(host: str, port: int, options: StandInOptions) -> None:
    """Serve the stand-in until SIGINT or SIGTERM (the `compaction-proxy stand-in`
    command); OSError when host:port cannot be listened on."""
    asyncio.run(_serve(host, port, options))


__all__ = [
    "ANALYSES",
    "CACHE",
    "COUNTER",
    "FAULT_COUNTS",
    "MAX_BODY_BYTES",
    "MODELS",
    "OPTIONS",
    "RECORD",
    "RECORDED",
    "REQUEST_ID",
    "SUMMARY_PURPOSE",
    "RecordedRequest",
    "StandInOptions",
    "_add_request_id",
    "_api_shell",
    "_credential",
    "_cut",
    "_gate",
    "_invalid",
    "_json_body",
    "_request_id",
    "_scaled",
    "_sse",
    "_stall",
    "_take_fault",
    "_tenant",
    "_text_pieces",
    "answer_faults",
    "api_error",
    "create_app",
    "handle_count_tokens",
    "handle_messages",
    "request_digest",
    "retry_headers",
    "run",
    "script_for",
    "send_json",
    "send_stream",
    "start",
]
