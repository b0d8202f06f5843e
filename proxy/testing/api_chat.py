"""The stand-in's OpenAI Chat Completions API (`POST /v1/chat/completions`).

- a Bearer credential is required (401 in OpenAI's shape otherwise); errors are
  `{"error": {"message", "type", "param", "code"}}` (`openai_error`, which the Responses
  API shares);
- validation by chat_validate.py (tool_call pairing, roles, content), and the window:
  400 `invalid_request_error`, code `context_length_exceeded`, OpenAI's wording;
- usage: prompt_tokens (the project's Chat count, scaled), completion_tokens, and
  `prompt_tokens_details.cached_tokens` from the prompt-cache model. OpenAI caches prefixes
  by itself: every message boundary is a breakpoint (`prompt_units`);
- streams of `data:` chunks: the role first, text in pieces, each tool_call's id and name
  then its arguments in fragments, a chunk with the finish_reason, with
  `stream_options.include_usage` a usage chunk with empty choices, then `data: [DONE]`.

Answers are deterministic: the id and `created` derive from the request, so the same
request gets the same completion (streamed or not).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
from aiohttp import web

from proxy.core.tokens import TokenCounter
from proxy.testing.answering import serve
from proxy.testing.api import Api, Event, Refusal, event, json_pieces, text_pieces
from proxy.testing.cache import Unit, prefix_units
from proxy.testing.prompt import Entry, Part, Prompt, Result, Text
from proxy.testing.reply import Call, Reply, Stop, Usage
from proxy.testing.standin_http import COUNTER, credential
from proxy.wire.chat import ChatCounter
from proxy.wire.chat_validation import validate_chat_request, window_error
from proxy.wire.common import OpenAIInvalid

CREATED = 1_764_000_000  # a fixed `created`: the same request gets the same bytes
FINGERPRINT = "fp_standin"
FINISH_REASONS = {Stop.END: "stop", Stop.TOOL: "tool_calls", Stop.LENGTH: "length"}
DEFAULT_MAX_TOKENS = 4096
UNAUTHORIZED = (
    "You didn't provide an API key. You need to provide your API key in an Authorization"
    " header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)
OPENAI_FAULTS = {
    "429": Refusal(429, "requests", "Rate limit reached for requests.", code="rate_limit_exceeded"),
    "529": Refusal(503, "server_error", "The engine is currently overloaded."),
    "500": Refusal(500, "server_error", "The server had an error while processing your request."),
}  # fmt: skip


def openai_error(refusal: Refusal) -> web.Response:
    """A refusal in OpenAI's error shape."""
    error = {
        "message": refusal.message,
        "type": refusal.kind,
        "param": refusal.param,
        "code": refusal.code,
    }
    return web.Response(
        status=refusal.status,
        body=orjson.dumps({"error": error}),
        content_type="application/json",
        headers=refusal.headers,
    )


def openai_gate(headers: Mapping[str, str]) -> Refusal | None:
    """OpenAI's APIs need a Bearer credential."""
    if credential(headers) is None:
        return Refusal(401, "invalid_request_error", UNAUTHORIZED)
    return None


def invalid(error: OpenAIInvalid | None) -> Refusal | None:
    if error is None:
        return None
    return Refusal(400, "invalid_request_error", error.message, error.param, error.code)


def _texts(content: Any) -> tuple[str, ...]:
    if isinstance(content, str):
        return (content,)
    parts = content if isinstance(content, list) else []
    return tuple(
        str(p.get("text", "")) for p in parts if isinstance(p, dict) and p.get("type") == "text"
    )


def _arguments(text: Any) -> Any:
    try:
        return orjson.loads(text or "{}")
    except (orjson.JSONDecodeError, TypeError):
        return text


def _entries(messages: list[Any]) -> Iterator[Entry]:
    for message in messages:
        role = str(message.get("role"))
        if role == "tool":
            result = Result(str(message.get("tool_call_id")), _texts(message.get("content")))
            yield Entry("user", (result,))
            continue
        parts: list[Part] = [Text(t) for t in _texts(message.get("content"))]
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            given = _arguments(function.get("arguments"))
            parts.append(Call(str(function.get("name")), given, str(call.get("id"))))
        yield Entry("system" if role == "developer" else role, tuple(parts))


def read(body: dict[str, Any]) -> Prompt:
    """A Chat body as the script reads it: a tool message is a user entry of one result."""
    messages = body.get("messages") or []
    tools = tuple(
        str((t.get("function") or {}).get("name"))
        for t in body.get("tools") or ()
        if isinstance(t, dict)
    )
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    entries = functools.partial(_entries, messages)
    return Prompt(entries, len(messages), tools, limit or DEFAULT_MAX_TOKENS, limit or 1024)


def prompt_units(body: dict[str, Any], counter: ChatCounter) -> list[Unit]:
    """Tools, then messages, as cache units. OpenAI caches the longest prefix of a prompt
    it has seen before (in 128-token steps, from 1,024 tokens), not only whole prompts:
    every message boundary is a breakpoint here."""
    running = 0
    tools = body.get("tools") or []
    pieces: list[tuple[bytes, Any, int]] = []
    if tools:
        running = counter.count_tools(tools)
        pieces.append((b"tools", tools, running))
    for i, message in enumerate(body.get("messages") or []):
        running += counter.count_message(message)
        pieces.append((f"message\0{i}".encode(), message, running))
    model = b"chat-model\0" + str(body.get("model")).encode()
    return prefix_units(model, pieces, every_boundary=True)


def usage_object(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt,
        "completion_tokens": usage.output,
        "total_tokens": usage.prompt + usage.output,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def message(reply: Reply) -> dict[str, Any]:
    """The reply as the assistant message of a choice."""
    out: dict[str, Any] = {
        "role": "assistant",
        "content": reply.text or None,
        "refusal": None,
        "annotations": [],
    }
    if reply.calls:
        out["tool_calls"] = [
            {
                "id": call.id or f"call_{reply.digest[24:48]}" + (f"{n}" if n else ""),
                "type": "function",
                "function": {"name": call.name, "arguments": orjson.dumps(call.input).decode()},
            }
            for n, call in enumerate(reply.calls)
        ]
    return out


def completion(body: dict[str, Any], model: str, reply: Reply, usage: Usage) -> dict[str, Any]:
    """The whole answer: `n` alike choices."""
    return {
        "id": f"chatcmpl-{reply.digest[:24]}",
        "object": "chat.completion",
        "created": CREATED,
        "model": model,
        "choices": [
            {
                "index": n,
                "message": message(reply),
                "logprobs": None,
                "finish_reason": FINISH_REASONS[reply.stop],
            }
            for n in range(int(body.get("n") or 1))
        ],
        "usage": usage_object(usage),
        "service_tier": "default",
        "system_fingerprint": FINGERPRINT,
    }


def chunks(whole: dict[str, Any], chunk_tokens: int, include_usage: bool) -> list[Event]:
    """The whole completion as the API streams it."""
    base = {
        "id": whole["id"],
        "object": "chat.completion.chunk",
        "created": whole["created"],
        "model": whole["model"],
        "service_tier": "default",
        "system_fingerprint": FINGERPRINT,
    }

    def chunk(kind: str, index: int, delta: dict[str, Any], finish: str | None = None) -> Event:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        data = {**base, "choices": [choice]}
        if include_usage:
            data["usage"] = None
        return event(kind, None, data)

    events = []
    for choice in whole["choices"]:
        n, said = choice["index"], choice["message"]
        events.append(chunk("start", n, {"role": "assistant", "content": "", "refusal": None}))
        for piece in text_pieces(said["content"], chunk_tokens) if said["content"] else ():
            events.append(chunk("delta", n, {"content": piece}))
        for k, call in enumerate(said.get("tool_calls") or ()):
            function = call["function"]
            first = {"index": k, "id": call["id"], "type": "function",
                     "function": {"name": function["name"], "arguments": ""}}  # fmt: skip
            events.append(chunk("delta", n, {"tool_calls": [first]}))
            for piece in json_pieces(function["arguments"]):
                fragment = {"index": k, "function": {"arguments": piece}}
                events.append(chunk("delta", n, {"tool_calls": [fragment]}))
        events.append(chunk("end", n, {}, choice["finish_reason"]))
    if include_usage:
        events.append(event("end", None, {**base, "choices": [], "usage": whole["usage"]}))
    return [*events, Event("end", b"[DONE]")]


STREAM_ERROR = event(
    "end",
    None,
    {"error": {"message": "The server is overloaded.", "type": "server_error",
               "param": None, "code": None}},
)  # fmt: skip


class OpenAIApi(Api):
    """What OpenAI's APIs share: a Bearer credential, errors in OpenAI's shape."""

    unparsable = "We could not parse the JSON body of your request. ({error})"
    faults = OPENAI_FAULTS

    def refuse(self, refusal: Refusal, request_id: str) -> web.Response:
        return openai_error(refusal)

    def gate(self, headers: Mapping[str, str]) -> Refusal | None:
        return openai_gate(headers)

    def streaming(self, body: Any) -> bool:
        return body.get("stream") is True


class ChatApi(OpenAIApi):
    name = "chat"
    ignored = ("stream", "stream_options")

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = ChatCounter(counter)

    def invalid(self, body: Any) -> Refusal | None:
        return invalid(validate_chat_request(body))

    def count(self, body: Any) -> int:
        return self.counter.count_request(body)

    def units(self, body: Any) -> list[Unit]:
        return prompt_units(body, self.counter)

    def too_long(self, tokens: int, window: int) -> Refusal | None:
        return invalid(window_error(tokens, window))

    def read(self, body: Any) -> Prompt:
        return read(body)

    def whole(self, body: Any, reply: Reply, usage: Usage) -> dict[str, Any]:
        return completion(body, self.model(body), reply, usage)

    def events(self, body: Any, whole: dict[str, Any], chunk_tokens: int) -> list[Event]:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return chunks(whole, chunk_tokens, include_usage)

    def recorded(self, whole: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        return [whole["choices"][0]["message"]], whole["usage"]

    def stream_error(self, events: list[Event]) -> Event:
        return STREAM_ERROR


async def handle_chat_completions(request: web.Request) -> web.StreamResponse:
    return await serve(request, ChatApi(request.app[COUNTER]))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", handle_chat_completions)
