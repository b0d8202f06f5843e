"""The stand-in's `POST /v1/responses`: a strict local imitation of OpenAI's Responses API.

It shares the stand-in's machinery (standin.py, chat_standin.py): the recorded requests, the
`x-stand-in` script (text, a client tool call, read_result, faults, token_delay,
chunk_tokens), the window per model, token_scale, the prompt-cache model behind
`input_tokens_details.cached_tokens`, and summaries for requests marked
`x-compaction-proxy-purpose: summary`. What is the Responses API's own:

- a Bearer credential (401 in OpenAI's shape); errors `{"error": {message, type, param,
  code}}`; validation by responses_validate.py; sealed reasoning/compaction content that
  was changed is refused (responses_items.py);
- a window exceeded: with `stream: true` the API answers 200 and reports it in the stream
  (`response.created`, `response.in_progress`, an `error` event with code
  `context_length_exceeded`, `response.failed`); without, a 400. `overflow="status"`
  answers 400 on streams too;
- answers: a reasoning item (sealed `encrypted_content` when `include` asks for it) when
  `reasoning` is set, then the text as an assistant message, then the call: a
  `custom_tool_call` when the named tool is a `custom` tool (script `tool.input.input` is
  its text), else a `function_call` (ids derive from the request: same request, same answer);
- Codex's compaction: a `compaction_trigger` as the last item is answered, when the
  stand-in plays OpenAI itself (`plays_openai`), with exactly one output item `{"type":
  "compaction", "encrypted_content": <sealed summary>}`, accepted (and counted as that
  summary) in later requests; otherwise both item types are unknown, as they are to other
  Responses-compatible servers. A handoff-summary request (`tools: []`, the last user
  message asking for a checkpoint/handoff summary) is answered with a summary text;
- `GET /v1/responses` with `Upgrade: websocket` (Codex's built-in provider tries a WebSocket
  first) gets `websocket_status`: 426 by default (Codex falls back to HTTP at once), or 404
  (Codex retries, then falls back), in OpenAI's error shape; or, with 101, is served
  (responses_ws.py: the same answers as frames on the socket);
- `x-codex-turn-state` on answers to Codex requests (`turn_state`), derived from the turn id
  in `x-codex-turn-metadata`, so tests can check that it reaches Codex and comes back;
- scenario mode (`scenario`): the script of each answer comes from a Scenario
  (codex_scenario.py) reading the request, for agents that cannot send headers.

Options live in `app[RESPONSES]` (set before the app starts; defaults otherwise).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from proxy.core.tokens import TokenCounter
from proxy.testing.chat_standin import _FAULT_STATUS, chat_error
from proxy.testing.codex_scenario import Scenario
from proxy.testing.responses_events import (
    Answer,
    error_event,
    failed_events,
    final_status,
    response_object,
    stream_error_position,
    stream_events,
    usage_object,
)
from proxy.testing.responses_items import (
    ItemCounter,
    as_messages,
    check_seals,
    next_ref_to_read,
    offered_custom,
    part_texts,
    seal,
)
from proxy.testing.script import (
    STATUS_FAULTS,
    Script,
    ScriptError,
    parse_script,
    plan_call,
    trim_to,
)
from proxy.testing.standin_http import (
    CACHE,
    COUNTER,
    OPTIONS,
    SUMMARY_PURPOSE,
    _credential,
    _scaled,
    _take_fault,
    _tenant,
    answer_faults,
    request_digest,
    retry_headers,
    send_json,
    send_stream,
)
from proxy.testing.summary import summarise
from proxy.wire.common import OpenAIInvalid
from proxy.wire.responses_units import input_items
from proxy.wire.responses_validation import validate_responses_request, window_error

HANDOFF = re.compile(r"checkpoint compaction|handoff summary", re.IGNORECASE)
SUMMARY_TOKENS = 1000  # a summary's budget when the request sets no max_output_tokens
DEFAULT_MAX_OUTPUT = 32_000
STREAM_FAULT = {
    "type": "server_error",
    "code": "server_error",
    "message": "The server had an error while processing your request.",
}


@dataclass
class ResponsesOptions:
    plays_openai: bool = False  # know compaction items and serve compaction_trigger
    # answer to a WebSocket upgrade on /v1/responses: 426 or 404, or 101 (served:
    # responses_ws.py), with frames of at most websocket_max_frame bytes
    websocket_status: int = 426
    websocket_max_frame: int = 32 * 1024 * 1024
    overflow: str = "stream"  # a stream over the window: "stream" (as the API) or "status" (400)
    accept_foreign_encrypted: bool = True  # encrypted_content the stand-in did not write
    seal_key: bytes = b"compaction-proxy stand-in"
    turn_state: bool = True  # send x-codex-turn-state to Codex requests
    scenario: Scenario | None = None


RESPONSES: web.AppKey[ResponsesOptions] = web.AppKey("standin_responses", ResponsesOptions)
EXTRA_HEADERS: web.RequestKey[dict[str, str]] = web.RequestKey("standin_responses_headers", dict)


def _unauthorized() -> web.Response:
    return chat_error(
        401,
        "You didn't provide an API key. You need to provide your API key in an Authorization"
        " header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        code=None,
    )


def _invalid(error: OpenAIInvalid) -> web.Response:
    return chat_error(400, error.message, param=error.param, code=error.code)


def _last_user_text(items: list[Any]) -> str:
    for item in reversed(items):
        if isinstance(item, dict) and item.get("type", "message") == "message":
            if item.get("role") == "user":
                return "\n".join(part_texts(item.get("content")))
            return ""
    return ""


def request_kind(body: dict[str, Any], purpose: str, options: ResponsesOptions) -> str:
    """ "compaction" (a compaction_trigger to serve), "summary" (a summary to write), or
    "turn"."""
    items = input_items(body)
    last = items[-1] if items else None
    if isinstance(last, dict) and last.get("type") == "compaction_trigger":
        return "compaction"
    if purpose == SUMMARY_PURPOSE:
        return "summary"
    if body.get("tools") == [] and HANDOFF.search(_last_user_text(items)):
        return "summary"
    return "turn"


def _summary(
    body: dict[str, Any], items: list[Any], options: ResponsesOptions, counter: TokenCounter
) -> str:
    budget = int(body.get("max_output_tokens") or SUMMARY_TOKENS)
    note = options.scenario.summary_note(body, options.seal_key) if options.scenario else ""
    note_tokens = counter.count_text(note) + 1 if note else 0
    text = summarise(
        {"messages": as_messages(items, options.seal_key), "max_tokens": budget - note_tokens},
        counter,
    )
    return f"{text}\n{note}" if note else text


def _reasoning_item(body: dict[str, Any], digest: str, key: bytes, thought: str) -> dict[str, Any]:
    item: dict[str, Any] = {"id": f"rs_{digest[:32]}", "type": "reasoning", "summary": []}
    if "reasoning.encrypted_content" in (body.get("include") or ()):
        item["encrypted_content"] = seal({"kind": "reasoning", "text": thought}, key)
    return item


def _message_item(digest: str, text: str) -> dict[str, Any]:
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
    return {
        "id": f"msg_{digest[:32]}",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [part],
    }


def _call_item(body: dict[str, Any], digest: str, call: dict[str, Any]) -> dict[str, Any]:
    name, given = str(call["name"]), call.get("input") or {}
    call_id = f"call_{digest[32:56]}"
    if offered_custom(body, name):
        raw = given.get("input") if isinstance(given, dict) else given
        text = raw if isinstance(raw, str) else orjson.dumps(given).decode()
        return {
            "id": f"ctc_{digest[:32]}",
            "type": "custom_tool_call",
            "status": "completed",
            "call_id": call_id,
            "name": name,
            "input": text,
        }
    return {
        "id": f"fc_{digest[:32]}",
        "type": "function_call",
        "status": "completed",
        "arguments": orjson.dumps(given).decode(),
        "call_id": call_id,
        "name": name,
    }


def plan_responses_answer(
    body: dict[str, Any],
    kind: str,
    script: Script,
    options: ResponsesOptions,
    counter: TokenCounter,
    digest: str,
) -> Answer:
    items = input_items(body)
    key = options.seal_key
    if kind == "compaction":
        summary = _summary(body, items[:-1], options, counter)
        sealed = seal({"kind": "compaction", "text": summary, "items": len(items) - 1}, key)
        compaction = {"id": f"cmp_{digest[:32]}", "type": "compaction", "encrypted_content": sealed}
        return Answer([compaction], max(1, counter.count_text(summary)))
    override = _summary(body, items, options, counter) if kind == "summary" else None
    call, text = plan_call(body, script, next_ref_to_read, override)
    limit = int(body.get("max_output_tokens") or DEFAULT_MAX_OUTPUT)
    incomplete = None
    if text and counter.count_text(text) > limit:
        text, call, incomplete = trim_to(text, limit, counter), None, "max_output_tokens"
    out: list[dict[str, Any]] = []
    reasoning_tokens = 0
    if isinstance(body.get("reasoning"), dict) and kind == "turn":
        thought = f"Planning the answer to a request of {len(items)} input items."
        out.append(_reasoning_item(body, digest, key, thought))
        reasoning_tokens = counter.count_text(thought)
    tokens = reasoning_tokens
    if text:
        out.append(_message_item(digest, text))
        tokens += counter.count_text(text)
    if call is not None:
        item = _call_item(body, digest, call)
        out.append(item)
        tokens += counter.count_text(item["name"]) + counter.count_text(
            item.get("arguments") or item.get("input") or ""
        )
    return Answer(out, max(1, tokens), reasoning_tokens, incomplete)


def _script(
    app: web.Application,
    headers: Mapping[str, str],
    body: dict[str, Any],
    options: ResponsesOptions,
) -> Script:
    defaults = dict(app[OPTIONS].script)
    if options.scenario is not None:
        defaults.update(options.scenario.script(body, options.seal_key))
    try:
        return parse_script(defaults, headers.get("x-stand-in"))
    except TypeError as exc:
        raise ScriptError(str(exc)) from None


def turn_state(headers: Mapping[str, str], options: ResponsesOptions) -> dict[str, str]:
    metadata = headers.get("x-codex-turn-metadata")
    if not options.turn_state or not metadata:
        return {}
    try:
        turn = orjson.loads(metadata).get("turn_id")
    except (orjson.JSONDecodeError, AttributeError):
        return {}
    if not turn:
        return {}
    return {"x-codex-turn-state": "sts_" + hashlib.sha256(str(turn).encode()).hexdigest()[:24]}


@dataclass
class Streamed:
    """An answer to stream: its events, the script's delays and the fault that strikes."""

    events: list[tuple[str, bytes]]
    script: Script
    fault: str | None
    fault_event: bytes


def answer(
    app: web.Application,
    headers: Mapping[str, str],
    tenant: str,
    body: Any,
    *,
    streaming: bool | None = None,
) -> web.Response | Streamed | JsonFault:
    """The answer to one parsed Responses request, whichever transport carried it: an
    error or a JSON answer as a response, or the events of a stream. `streaming` None:
    as the body's `stream` says (the WebSocket always streams)."""
    options = app[RESPONSES]
    try:
        script = _script(app, headers, body if isinstance(body, dict) else {}, options)
    except ScriptError as exc:
        return chat_error(400, str(exc))
    fault = _take_fault(app, script, STATUS_FAULTS)
    if fault is not None:
        status, kind, code, text = _FAULT_STATUS[fault]
        extra = retry_headers(script) if fault == "429" else {}
        return chat_error(status, text, kind, code=code, headers=extra)

    error = validate_responses_request(body, openai=options.plays_openai)
    if error:
        return _invalid(error)
    unverified = check_seals(body, options.seal_key, options.accept_foreign_encrypted)
    if unverified:
        message = f"The encrypted content for item {unverified} could not be verified."
        return _invalid(OpenAIInvalid(message, "input", "invalid_encrypted_content"))
    counter = ItemCounter(app[COUNTER], options.seal_key)
    raw_total = counter.count_request(body)
    total = _scaled(raw_total, app[OPTIONS])
    if streaming is None:
        streaming = body.get("stream") is True
    digest = request_digest(body, ("stream",))
    head = {"id": f"resp_{digest[:32]}", "model": body["model"]}
    overflow = window_error(total, app[OPTIONS].window_for(body["model"]))
    if overflow:
        if not streaming or options.overflow == "status":
            return _invalid(overflow)
        error_body = {
            "type": "invalid_request_error",
            "code": overflow.code,
            "message": overflow.message,
            "param": overflow.param,
        }
        return Streamed(failed_events(head, body, error_body), script, None, b"")

    purpose = headers.get("x-compaction-proxy-purpose", "").strip().lower()
    kind = request_kind(body, purpose, options)
    planned = plan_responses_answer(body, kind, script, options, app[COUNTER], digest)
    cache = app[CACHE].account(tenant, counter.prompt_units(body), raw_total)
    cached = min(_scaled(cache.cache_read_input_tokens, app[OPTIONS]), total)
    usage = usage_object(total, cached, planned)
    fault = _take_fault(app, script, answer_faults(streaming))
    if streaming:
        events = stream_events(head, body, planned, usage, script)
        fault_event = error_event(stream_error_position(events), STREAM_FAULT)
        return Streamed(events, script, fault, fault_event)
    final = final_status(planned)
    response = response_object(head, body, planned.items, final, usage, planned.incomplete)
    if fault is None:
        return web.Response(body=orjson.dumps(response), content_type="application/json")
    return JsonFault(orjson.dumps(response), script, fault)


@dataclass
class JsonFault:
    """A JSON answer a fault strikes (sent by send_json)."""

    payload: bytes
    script: Script
    fault: str


async def handle_responses(request: web.Request) -> web.StreamResponse:
    app = request.app
    if _credential(request) is None:
        return _unauthorized()
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        return chat_error(400, f"We could not parse the JSON body of your request. ({exc})")
    request[EXTRA_HEADERS] = turn_state(request.headers, app[RESPONSES])
    out = answer(app, request.headers, _tenant(request), body)
    if isinstance(out, Streamed):
        return await send_stream(request, out.events, out.script, out.fault, out.fault_event)
    if isinstance(out, JsonFault):
        return await send_json(request, out.payload, out.script, out.fault)
    return out


async def handle_responses_get(request: web.Request) -> web.Response:
    """A WebSocket upgrade (Codex's first try) or a plain GET: neither is served."""
    upgrade = request.headers.get("upgrade", "").lower() == "websocket"
    if _credential(request) is None:
        return _unauthorized()
    status = request.app[RESPONSES].websocket_status if upgrade else 404
    if status == 426:
        return chat_error(
            426,
            "WebSocket connections to /v1/responses are not supported by this server;"
            " use HTTP POST.",
            code="websocket_not_supported",
        )
    return chat_error(status, f"Invalid URL (GET {request.path})", code=None)


async def _add_extra_headers(request: web.Request, response: web.StreamResponse) -> None:
    for name, value in request.get(EXTRA_HEADERS, {}).items():
        response.headers.setdefault(name, value)


def add_routes(app: web.Application) -> None:
    app[RESPONSES] = ResponsesOptions()
    app.on_response_prepare.append(_add_extra_headers)
    app.router.add_post("/v1/responses", handle_responses)
    # GET /v1/responses: responses_ws.py (served with websocket_status 101, else this module's)
