"""The stand-in's `POST /v1/chat/completions`: a strict local imitation of OpenAI's Chat API.

It shares the stand-in's machinery (standin.py): the recorded requests, the `x-stand-in`
script (text, a client tool call, read_result, faults, token_delay, chunk_tokens), the
window per model, token_scale, and the summary answers for requests marked
`x-compaction-proxy-purpose: summary`. What is Chat's own:

- a Bearer credential is required (401 in OpenAI's shape otherwise); errors are
  `{"error": {"message", "type", "param", "code"}}`;
- validation by chat_validate.py (tool_call pairing, roles, content), and the window:
  400 `invalid_request_error`, code `context_length_exceeded`, OpenAI's wording;
- usage: prompt_tokens (the project's Chat count, scaled), completion_tokens, and
  `prompt_tokens_details.cached_tokens` from the same prompt-cache model as the Messages
  route. OpenAI caches prefixes by itself, so the whole prompt (tools, then each message)
  is one run of units with a breakpoint at its end;
- streams of `data:` chunks: the role first, text in pieces, each tool_call's id and name
  then its arguments in fragments, a chunk with the finish_reason, with
  `stream_options.include_usage` a usage chunk with empty choices, then `data: [DONE]`.

Answers are deterministic: the id and `created` derive from the request, so the same
request gets the same completion (streamed or not).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from proxy.core.tokens import TokenCounter
from proxy.testing.cache import Unit
from proxy.testing.script import (
    READ_RESULT,
    STATUS_FAULTS,
    STUB_REF,
    Script,
    ScriptError,
    plan_call,
    trim_to,
)
from proxy.testing.standin_http import (
    CACHE,
    COUNTER,
    OPTIONS,
    RECORD,
    SUMMARY_PURPOSE,
    _credential,
    _scaled,
    _take_fault,
    _tenant,
    _text_pieces,
    answer_faults,
    request_digest,
    retry_headers,
    script_for,
    send_json,
    send_stream,
    summariser_pace,
)
from proxy.testing.summary import summarise
from proxy.wire.chat import ChatCounter
from proxy.wire.chat_validation import validate_chat_request, window_error
from proxy.wire.common import OpenAIInvalid

ARGUMENT_PIECE_CHARS = 24
CREATED = 1_764_000_000  # a fixed `created`: the same request gets the same bytes
FINGERPRINT = "fp_standin"
_FAULT_STATUS = {
    "429": (429, "requests", "rate_limit_exceeded", "Rate limit reached for requests."),
    "529": (503, "server_error", None, "The engine is currently overloaded."),
    "500": (500, "server_error", None, "The server had an error while processing your request."),
}


def chat_error(
    status: int,
    message: str,
    error_type: str = "invalid_request_error",
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return web.Response(
        status=status, body=orjson.dumps(body), content_type="application/json", headers=headers
    )


def _invalid(error: OpenAIInvalid) -> web.Response:
    return chat_error(400, error.message, param=error.param, code=error.code)


@dataclass(frozen=True)
class ChatAnswer:
    text: str | None
    calls: list[dict[str, Any]]  # tool_calls, arguments as JSON text
    finish_reason: str
    completion_tokens: int


# -- the answer ---------------------------------------------------------------------------


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    parts = content if isinstance(content, list) else []
    return [
        str(p.get("text", "")) for p in parts if isinstance(p, dict) and p.get("type") == "text"
    ]


def next_ref_to_read(body: dict[str, Any], keep_reading: bool = False) -> str | None:
    """The first stub ref not read yet, when read_result is offered and the request is not
    itself answering a read (the Chat twin of script.next_ref_to_read)."""
    tools = body.get("tools") or []
    offered = any(
        isinstance(t, dict) and (t.get("function") or {}).get("name") == READ_RESULT for t in tools
    )
    if not offered:
        return None
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    read_calls: dict[str, str] = {}  # tool_call id -> ref
    refs: list[str] = []
    for message in messages:
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            if function.get("name") == READ_RESULT:
                try:
                    ref = orjson.loads(function.get("arguments") or "{}").get("ref")
                except (orjson.JSONDecodeError, AttributeError):
                    ref = None
                read_calls[str(call.get("id"))] = str(ref)
        for text in _texts(message.get("content")):
            refs.extend(STUB_REF.findall(text))
    last = messages[-1] if messages else {}
    if not keep_reading and last.get("role") == "tool" and last.get("tool_call_id") in read_calls:
        return None
    already = set(read_calls.values())
    return next((ref for ref in refs if ref not in already), None)


def plan_chat_answer(
    body: dict[str, Any],
    script: Script,
    counter: TokenCounter,
    request_hash: str,
    *,
    text_override: str | None = None,
) -> ChatAnswer:
    call, text = plan_call(body, script, next_ref_to_read, text_override)
    finish = "tool_calls" if call is not None else "stop"
    limit = body.get("max_completion_tokens") or body.get("max_tokens") or 4096
    if text and counter.count_text(text) > limit:
        text, call, finish = trim_to(text, limit, counter), None, "length"
    calls: list[dict[str, Any]] = []
    if call is not None:
        name, arguments = str(call["name"]), orjson.dumps(call["input"]).decode()
        function = {"name": name, "arguments": arguments}
        calls.append({"id": f"call_{request_hash[:24]}", "type": "function", "function": function})
    tokens = counter.count_text(text or "")
    if call is not None:
        tokens += counter.count_text(name) + counter.count_text(arguments)
    return ChatAnswer(text or None, calls, finish, max(1, tokens))


# -- usage --------------------------------------------------------------------------------


def prompt_units(body: dict[str, Any], counter: ChatCounter) -> list[Unit]:
    """Tools, then messages, as cache units. OpenAI caches the longest prefix of a prompt
    it has seen before (in 128-token steps, from 1,024 tokens), not only whole prompts:
    every message boundary is a breakpoint here, the closest whole-message model of it."""
    digest = hashlib.sha256(b"chat-model\0" + str(body.get("model")).encode()).digest()
    units: list[Unit] = []
    running = 0
    tools = body.get("tools") or []
    pieces: list[tuple[bytes, Any, int]] = []
    if tools:
        running = counter.count_tools(tools)
        pieces.append((b"tools", tools, running))
    for i, message in enumerate(body.get("messages") or []):
        running += counter.count_message(message)
        pieces.append((f"message\0{i}".encode(), message, running))
    for tag, value, cumulative in pieces:
        canonical = orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
        digest = hashlib.sha256(digest + tag + b"\0" + canonical).digest()
        units.append(Unit(digest, cumulative, "5m", True))
    return units


def _usage(prompt: int, cached: int, answer: ChatAnswer) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": answer.completion_tokens,
        "total_tokens": prompt + answer.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


# -- the route ----------------------------------------------------------------------------


async def handle_chat_completions(request: web.Request) -> web.StreamResponse:
    app = request.app
    if _credential(request) is None:
        return chat_error(
            401,
            "You didn't provide an API key. You need to provide your API key in an"
            " Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        )
    try:
        script = script_for(request)
    except ScriptError as exc:
        return chat_error(400, str(exc))
    fault = _take_fault(app, script, STATUS_FAULTS)
    if fault is not None:
        status, kind, code, text = _FAULT_STATUS[fault]
        headers = retry_headers(script) if fault == "429" else {}
        return chat_error(status, text, kind, code=code, headers=headers)

    raw = await request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return chat_error(400, f"We could not parse the JSON body of your request. ({exc})")
    error = validate_chat_request(body)
    if error:
        return _invalid(error)
    options = app[OPTIONS]
    counter = ChatCounter(app[COUNTER])
    total = _scaled(counter.count_request(body), options)
    error = window_error(total, options.window_for(body["model"]))
    if error:
        return _invalid(error)

    digest = request_digest(body, ("stream", "stream_options"))
    purpose = request.headers.get("x-compaction-proxy-purpose", "").strip().lower()
    summary = None
    if purpose == SUMMARY_PURPOSE:
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        summary = summarise({**body, "max_tokens": limit}, app[COUNTER], options.summary_loss)
        await summariser_pace(options)
    answer = plan_chat_answer(body, script, app[COUNTER], digest[24:], text_override=summary)
    units = prompt_units(body, counter)
    cache = app[CACHE].account(_tenant(request), units, counter.count_request(body))
    cached = _scaled(cache.cache_read_input_tokens, options)
    usage = _usage(total, min(cached, total), answer)
    request[RECORD].usage = usage  # what this answer reports, for tests to compare
    head = {
        "id": f"chatcmpl-{digest[:24]}",
        "created": CREATED,
        "model": body["model"],
    }
    choices = int(body.get("n") or 1)
    streaming = body.get("stream") is True
    fault = _take_fault(app, script, answer_faults(streaming))
    if streaming:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        chunks = _chunks(head, usage, answer, choices, script, include_usage)
        return await send_stream(request, chunks, script, fault, STREAM_ERROR_CHUNK)
    payload = orjson.dumps(_completion(head, usage, answer, choices))
    return await send_json(request, payload, script, fault)


def _message(answer: ChatAnswer) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": answer.text,
        "refusal": None,
        "annotations": [],
    }
    if answer.calls:
        message["tool_calls"] = answer.calls
    return message


def _completion(
    head: dict[str, Any], usage: dict[str, Any], answer: ChatAnswer, choices: int
) -> dict[str, Any]:
    return {
        "id": head["id"],
        "object": "chat.completion",
        "created": head["created"],
        "model": head["model"],
        "choices": [
            {
                "index": n,
                "message": _message(answer),
                "logprobs": None,
                "finish_reason": answer.finish_reason,
            }
            for n in range(choices)
        ],
        "usage": usage,
        "service_tier": "default",
        "system_fingerprint": FINGERPRINT,
    }


def _chunks(
    head: dict[str, Any],
    usage: dict[str, Any],
    answer: ChatAnswer,
    choices: int,
    script: Script,
    include_usage: bool,
) -> Iterator[tuple[str, bytes]]:
    """(kind, bytes) of the stream; kind marks where faults and delays apply."""
    base = {
        "id": head["id"],
        "object": "chat.completion.chunk",
        "created": head["created"],
        "model": head["model"],
        "service_tier": "default",
        "system_fingerprint": FINGERPRINT,
    }

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
        data = {
            **base,
            "choices": [
                {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
            ],
        }
        if include_usage:
            data["usage"] = None
        return b"data: " + orjson.dumps(data) + b"\n\n"

    for n in range(choices):
        yield "start", chunk(n, {"role": "assistant", "content": "", "refusal": None})
        if answer.text:
            for piece in _text_pieces(answer.text, script.chunk_tokens):
                yield "delta", chunk(n, {"content": piece})
        for k, call in enumerate(answer.calls):
            first = {
                "index": k,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            yield "delta", chunk(n, {"tool_calls": [first]})
            arguments = call["function"]["arguments"]
            for i in range(0, len(arguments), ARGUMENT_PIECE_CHARS):
                piece = arguments[i : i + ARGUMENT_PIECE_CHARS]
                fragment = {"index": k, "function": {"arguments": piece}}
                yield "delta", chunk(n, {"tool_calls": [fragment]})
        yield "end", chunk(n, {}, answer.finish_reason)
    if include_usage:
        data = {**base, "choices": [], "usage": usage}
        yield "end", b"data: " + orjson.dumps(data) + b"\n\n"
    yield "end", b"data: [DONE]\n\n"


STREAM_ERROR_CHUNK = b"data: " + orjson.dumps(
    {"error": {"message": "The server is overloaded.", "type": "server_error",
               "param": None, "code": None}}
) + b"\n\n"  # fmt: skip


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", handle_chat_completions)
