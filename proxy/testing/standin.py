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
import fnmatch
import hashlib
import math
import secrets
import signal
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from proxy.core.tokens import TokenCounter, default_counter
from proxy.testing.cache import PromptCache, Unit, prompt_units
from proxy.testing.script import (
    STATUS_FAULTS,
    Answer,
    Script,
    ScriptError,
    parse_script,
    plan_answer,
)
from proxy.testing.summary import summarise
from proxy.testing.validate import (
    validate_count_tokens_request,
    validate_messages_request,
    window_error,
)

SUMMARY_PURPOSE = "summary"
MAX_BODY_BYTES = 32 * 1024 * 1024
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


@dataclass
class StandInOptions:
    windows: dict[str, int] = field(default_factory=lambda: {"*": 200_000})
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


RECORDED: web.AppKey[list[RecordedRequest]] = web.AppKey("standin_recorded", list)
OPTIONS: web.AppKey[StandInOptions] = web.AppKey("standin_options", StandInOptions)
CACHE: web.AppKey[PromptCache] = web.AppKey("standin_cache", PromptCache)
FAULT_COUNTS: web.AppKey[Counter[str]] = web.AppKey("standin_fault_counts", Counter)
COUNTER: web.AppKey[TokenCounter] = web.AppKey("standin_counter", TokenCounter)
ANALYSES: web.AppKey[dict[tuple[bytes, str, str], _Analysis]] = web.AppKey("standin_analyses", dict)
ANALYSIS_MEMO_SIZE = 64
REQUEST_ID: web.RequestKey[str] = web.RequestKey("standin_request_id", str)
RECORD: web.RequestKey[RecordedRequest] = web.RequestKey("standin_record", RecordedRequest)


def api_error(
    status: int, kind: str, message: str, request_id: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = {"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id}
    return web.Response(
        status=status, body=orjson.dumps(body), content_type="application/json", headers=headers
    )


def _request_id(request: web.Request) -> str:
    rid = request.get(REQUEST_ID)
    if rid is None:
        rid = request[REQUEST_ID] = "req_" + secrets.token_hex(12)
    return rid


def _invalid(request: web.Request, message: str) -> web.Response:
    return api_error(400, "invalid_request_error", message, _request_id(request))


@web.middleware
async def _api_shell(request: web.Request, handler: Any) -> web.StreamResponse:
    """Records the request, maps routing errors to the API's shape, notes the outcome."""
    rid = _request_id(request)
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in request.raw_headers}
    record = RecordedRequest(request.method, request.path_qs, headers, b"")
    recorded = request.app[RECORDED]
    recorded.append(record)
    limit = request.app[OPTIONS].max_recorded
    if limit is not None and len(recorded) > limit:
        del recorded[: len(recorded) - limit]
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


async def _add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.setdefault("request-id", _request_id(request))


def _credential(request: web.Request) -> str | None:
    key = request.headers.get("x-api-key", "").strip()
    if key:
        return key
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer " and auth[7:].strip():
        return auth[7:].strip()
    return None


def _gate(request: web.Request) -> web.Response | None:
    """The header checks every route makes before anything else."""
    if _credential(request) is None:
        return api_error(
            401, "authentication_error", "x-api-key header is required", _request_id(request)
        )
    if not request.headers.get("anthropic-version"):
        return _invalid(request, "anthropic-version: header is required")
    return None


def _tenant(request: web.Request) -> str:
    return hashlib.sha256((_credential(request) or "").encode()).hexdigest()[:32]


def request_digest(body: dict[str, Any], ignored: tuple[str, ...]) -> str:
    """The hash answers derive from: streamed or not, the same request gets the same one."""
    same = {k: v for k, v in body.items() if k not in ignored}
    return hashlib.sha256(orjson.dumps(same, option=orjson.OPT_SORT_KEYS)).hexdigest()


def script_for(request: web.Request) -> Script:
    """The stand-in's default script with the request's `x-stand-in` laid over it."""
    try:
        return parse_script(request.app[OPTIONS].script, request.headers.get("x-stand-in"))
    except TypeError as exc:  # a key of the wrong type
        raise ScriptError(str(exc)) from None


def retry_headers(script: Script) -> dict[str, str]:
    """What a 429 fault says about when to come back."""
    seconds = max(1, -(-int(script.retry_after_ms) // 1000))
    return {"retry-after": str(seconds), "retry-after-ms": f"{script.retry_after_ms:g}"}


async def _json_body(request: web.Request) -> tuple[Any, web.Response | None]:
    try:
        return orjson.loads(await request.read()), None
    except orjson.JSONDecodeError as exc:
        return None, _invalid(request, f"There was an error parsing the body: {exc}")


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


def _take_fault(app: web.Application, script: Script, kinds: tuple[str, ...]) -> str | None:
    """The script's fault if it is of these kinds and its `fault_times` is not used up."""
    fault = script.fault
    if fault not in kinds:
        return None
    seen = app[FAULT_COUNTS][fault]
    app[FAULT_COUNTS][fault] += 1
    if script.fault_times is not None and seen >= script.fault_times:
        return None
    return fault


@dataclass(frozen=True)
class _Analysis:
    """What a request body implies, whoever sends it: memoised by the body's bytes."""

    error: str | None
    streaming: bool = False
    total: int = 0
    units: tuple[Unit, ...] = ()
    head: dict[str, Any] = field(default_factory=dict)
    answer: Answer | None = None


def _analyse(raw: bytes, script: Script, purpose: str, app: web.Application) -> _Analysis:
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
    summary = summarise(body, counter) if purpose == SUMMARY_PURPOSE else None
    answer = plan_answer(body, script, counter, digest[24:], text_override=summary)
    head = {"id": f"msg_{digest[:24]}", "type": "message", "role": "assistant"}
    head["model"] = body["model"]
    units = tuple(prompt_units(body, counter))
    return _Analysis(None, bool(body.get("stream")), total, units, head, answer)


def _analysis(request: web.Request, raw: bytes, script: Script) -> _Analysis:
    """The body's analysis; a repeated request (benchmarks) skips parsing and counting."""
    purpose = request.headers.get("x-compaction-proxy-purpose", "").strip().lower()
    header = request.headers.get("x-stand-in", "")  # with the options, it fixes the script
    key = (hashlib.blake2b(raw, digest_size=16).digest(), header, purpose)
    memo = request.app[ANALYSES]
    found = memo.pop(key, None)
    if found is None:
        found = _analyse(raw, script, purpose, request.app)
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

    fault = _take_fault(app, script, STATUS_FAULTS)
    if fault is not None:
        status, kind, text = _FAULT_STATUS[fault]
        retry = retry_headers(script) if fault == "429" else {}
        return api_error(status, kind, text, _request_id(request), retry)

    analysis = _analysis(request, await request.read(), script)
    if analysis.error is not None or analysis.answer is None:
        return _invalid(request, analysis.error or "")
    fault = _take_fault(app, script, answer_faults(analysis.streaming))
    tenant = _tenant(request)
    usage = app[CACHE].account(tenant, list(analysis.units), analysis.total).as_usage()
    if app[OPTIONS].token_scale != 1.0:
        for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
            usage[key] = _scaled(usage[key], app[OPTIONS])
    if analysis.streaming:
        events = _events(analysis.head, usage, analysis.answer, script)
        return await send_stream(request, events, script, fault, STREAM_ERROR_EVENT)
    payload = _message_bytes(analysis.head, usage, analysis.answer)
    return await send_json(request, payload, script, fault)


def answer_faults(streaming: bool) -> tuple[str, ...]:
    """The faults that strike once the answer is under way."""
    return ("stream_error", "eof", "stall") if streaming else ("eof", "stall")


def _scaled(tokens: int, options: StandInOptions) -> int:
    return tokens if options.token_scale == 1.0 else math.ceil(tokens * options.token_scale)


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


async def send_json(
    request: web.Request, payload: bytes, script: Script, fault: str | None
) -> web.StreamResponse:
    """A JSON answer; an `eof` fault cuts it halfway, a `stall` holds it back first."""
    if fault is None:
        return web.Response(body=payload, content_type="application/json")
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = len(payload)
    await response.prepare(request)
    if fault == "eof":
        await response.write(payload[: len(payload) // 2])
        _cut(request)
        return response
    await _stall(request, script.stall_seconds)
    await response.write(payload)
    await response.write_eof()
    return response


def _cut(request: web.Request) -> None:
    """End the connection mid-body (what a dropped upstream looks like)."""
    record = request.get(RECORD)
    if record is not None:
        record.outcome = "cut"
    if request.transport is not None:
        request.transport.close()


async def _stall(request: web.Request, seconds: float) -> None:
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


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _text_pieces(text: str, words_per_piece: int) -> Iterator[str]:
    words = text.split(" ")
    for i in range(0, len(words), words_per_piece):
        piece = " ".join(words[i : i + words_per_piece])
        yield piece if i + words_per_piece >= len(words) else piece + " "


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


async def send_stream(
    request: web.Request,
    events: Iterable[tuple[str, bytes]],
    script: Script,
    fault: str | None,
    error_event: bytes,
) -> web.StreamResponse:
    """Write (kind, bytes) events with the script's delays; a `stall` holds back after the
    start, `stream_error` (then `error_event`) or `eof` strikes after the first delta."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    deltas = 0
    for kind, event in events:
        if kind == "delta":
            if deltas and script.token_delay:
                await asyncio.sleep(script.token_delay)
            deltas += 1
        elif kind == "end" and fault in ("stream_error", "eof"):
            break  # the answer had no delta to cut after
        await response.write(event)
        if kind == "start" and fault == "stall":
            await _stall(request, script.stall_seconds)
        if kind == "delta" and deltas == 1 and fault in ("stream_error", "eof"):
            break
    if fault == "stream_error":
        await response.write(error_event)
    elif fault == "eof":
        _cut(request)
        return response
    await response.write_eof()
    return response


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
    from proxy.testing.chat_standin import add_routes  # it builds on this module

    add_routes(app)  # POST /v1/chat/completions
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
    print(f"stand-in upstream (Messages and Chat Completions) listening on {url}", flush=True)
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
