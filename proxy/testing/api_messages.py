"""The stand-in's Anthropic Messages API.

Routes: `POST /v1/messages` (JSON or SSE stream, `?beta=true` accepted),
`POST /v1/messages/count_tokens`, `GET /v1/models`, `GET /v1/models/{id}`. Every request
needs a credential (`x-api-key` or `authorization: Bearer`) and `anthropic-version`.
Requests are validated by validate.py; usage has the prompt cache's reads and writes
(cache.py: breakpoints are the request's `cache_control`); errors are
`{"type": "error", "error": {"type", "message"}, "request_id"}`.

Answers: a signed thinking block (when thinking is on and the script says `thinking`),
the text, then the tool_use blocks; streamed as `message_start`, a ping, per block
`content_block_start`, its deltas (text in pieces of words, a call's input as JSON in
pieces), `content_block_stop`, a ping, `message_delta` (stop reason, usage) and
`message_stop`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
from aiohttp import web

from proxy.core.model_names import anthropic_name
from proxy.core.tokens import TokenCounter, loaded_tools
from proxy.testing import api_gemini
from proxy.testing.answering import Checked, count_tokens, serve
from proxy.testing.api import Api, Event, Refusal, event, json_pieces, text_pieces
from proxy.testing.cache import Unit, prompt_units
from proxy.testing.prompt import Entry, Part, Prompt, Result, Text
from proxy.testing.reply import Call, Reply, Stop, Usage
from proxy.testing.standin_http import (
    COUNTER,
    api_error,
    credential,
    request_id,
)
from proxy.wire.anthropic_validation import (
    thinking_signature,
    validate_count_tokens_request,
    validate_messages_request,
    window_error,
)

MODELS = (
    ("claude-opus-4-5-20251101", "Claude Opus 4.5", "2025-11-01T00:00:00Z"),
    ("claude-sonnet-4-5-20250929", "Claude Sonnet 4.5", "2025-09-29T00:00:00Z"),
    ("claude-haiku-4-5-20251001", "Claude Haiku 4.5", "2025-10-01T00:00:00Z"),
)
STOP_REASONS = {Stop.END: "end_turn", Stop.TOOL: "tool_use", Stop.LENGTH: "max_tokens"}
DEFAULT_MAX_TOKENS = 4096
INVALID = "invalid_request_error"


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def _texts(block: Any) -> list[str]:
    """The texts of a text block, or of a tool result's content."""
    if not isinstance(block, dict):
        return []
    if block.get("type") == "text":
        return [str(block.get("text") or "")]
    if block.get("type") == "tool_result":
        return [t for inner in _blocks(block.get("content")) for t in _texts(inner)]
    return []


def _part(block: Any) -> Part | None:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text":
        return Text(str(block.get("text") or ""))
    if kind == "tool_use":
        return Call(str(block.get("name")), block.get("input"), str(block.get("id")))
    if kind == "tool_result":
        return Result(str(block.get("tool_use_id")), tuple(_texts(block)))
    return None


def _entries(messages: list[Any]) -> Iterator[Entry]:
    for message in messages:
        parts = (_part(b) for b in _blocks(message.get("content")))
        yield Entry(str(message.get("role")), tuple(p for p in parts if p))


def read(body: dict[str, Any]) -> Prompt:
    """A Messages body as the script reads it."""
    messages = body.get("messages") or []
    # A deferred tool (tool search) is offered only once a tool_reference loads it, as
    # the API expands it only there: the script cannot call one it was not shown.
    listed = loaded_tools(body.get("tools"), messages)
    offered = listed if isinstance(listed, list) else ()
    tools = tuple(str(t["name"]) for t in offered if isinstance(t, dict) and "name" in t)
    thinking = body.get("thinking")
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, Mapping) else None
    schema = fmt.get("schema") if isinstance(fmt, Mapping) else None
    json_schema = isinstance(fmt, Mapping) and fmt.get("type") == "json_schema"
    return Prompt(
        functools.partial(_entries, messages),
        len(messages),
        tools,
        int(body.get("max_tokens") or 0) or DEFAULT_MAX_TOKENS,
        int(body.get("max_tokens") or 1024),
        isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"),
        schema=schema if json_schema and isinstance(schema, Mapping) else None,
    )


def content(reply: Reply) -> list[dict[str, Any]]:
    """The reply's content blocks: thinking, text, tool calls."""
    blocks: list[dict[str, Any]] = []
    if reply.thinking:
        signature = thinking_signature(reply.thinking)
        blocks.append({"type": "thinking", "thinking": reply.thinking, "signature": signature})
    if reply.text:
        blocks.append({"type": "text", "text": reply.text})
    for n, call in enumerate(reply.calls):
        tool_id = call.id or f"toolu_{reply.digest[24:48]}" + (f"{n}" if n else "")
        blocks.append({"type": "tool_use", "id": tool_id, "name": call.name, "input": call.input})
    return blocks


def usage_object(usage: Usage) -> dict[str, Any]:
    write = usage.cache_write
    return {
        "input_tokens": usage.fresh,
        "cache_creation_input_tokens": write,
        "cache_read_input_tokens": usage.cache_read,
        "cache_creation": {
            "ephemeral_5m_input_tokens": 0 if usage.write_1h else write,
            "ephemeral_1h_input_tokens": write if usage.write_1h else 0,
        },
        "output_tokens": usage.output,
        "service_tier": "standard",
    }


def message(model: str, reply: Reply, usage: Usage) -> dict[str, Any]:
    """The whole answer."""
    return {
        "id": f"msg_{reply.digest[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content(reply),
        "stop_reason": STOP_REASONS[reply.stop],
        "stop_sequence": None,
        "usage": usage_object(usage),
    }


def _delta(index: int, delta: dict[str, Any]) -> Event:
    data = {"type": "content_block_delta", "index": index, "delta": delta}
    return event("delta", "content_block_delta", data)


def _block_events(index: int, block: dict[str, Any], chunk_tokens: int) -> list[Event]:
    kind = block["type"]
    if kind == "text":
        start: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [
            {"type": "text_delta", "text": p} for p in text_pieces(block["text"], chunk_tokens)
        ]
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [
            *({"type": "thinking_delta", "thinking": p}
              for p in text_pieces(block["thinking"], chunk_tokens)),
            {"type": "signature_delta", "signature": block["signature"]},
        ]  # fmt: skip
    else:  # tool_use: the input arrives as JSON text in pieces, the first one empty
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        text = orjson.dumps(block["input"]).decode()
        pieces = ["", *json_pieces(text)]
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces]
    started = {"type": "content_block_start", "index": index, "content_block": start}
    return [
        event("block", "content_block_start", started),
        *(_delta(index, d) for d in deltas),
        event("block", "content_block_stop", {"type": "content_block_stop", "index": index}),
    ]


def stream(whole: dict[str, Any], chunk_tokens: int) -> list[Event]:
    """The whole answer as the API streams it."""
    usage = whole["usage"]
    start = {**whole, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events = [
        event("start", "message_start", {"type": "message_start", "message": start}),
        PING,
    ]
    for index, block in enumerate(whole["content"]):
        events.extend(_block_events(index, block, chunk_tokens))
    final = {k: v for k, v in usage.items() if k not in ("service_tier", "cache_creation")}
    delta = {"stop_reason": whole["stop_reason"], "stop_sequence": None}
    return [
        *events,
        PING,
        event("end", "message_delta", {"type": "message_delta", "delta": delta, "usage": final}),
        event("end", "message_stop", {"type": "message_stop"}),
    ]


FAULTS = {
    "429": Refusal(
        429, "rate_limit_error", "Number of request tokens has exceeded your rate limit."
    ),
    "529": Refusal(529, "overloaded_error", "Overloaded"),
    "500": Refusal(500, "api_error", "Internal server error"),
}  # fmt: skip
PING = event("ping", "ping", {"type": "ping"})
STREAM_ERROR = event(
    "end",
    "error",
    {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
)


class MessagesApi(Api):
    name = "messages"
    unparsable = "There was an error parsing the body: {error}"
    faults = FAULTS

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter

    def refuse(self, refusal: Refusal, request_id: str) -> web.Response:
        return api_error(
            refusal.status, refusal.kind, refusal.message, request_id, dict(refusal.headers)
        )

    def gate(self, headers: Mapping[str, str]) -> Refusal | None:
        if credential(headers) is None:
            return Refusal(401, "authentication_error", "x-api-key header is required")
        if not headers.get("anthropic-version"):
            return Refusal(400, INVALID, "anthropic-version: header is required")
        return None

    def invalid(self, body: Any) -> Refusal | None:
        message = validate_messages_request(body)
        return Refusal(400, INVALID, message) if message else None

    def deferral_refusal(self, body: Any) -> Refusal | None:
        where = deferral_field(body)
        return Refusal(400, INVALID, f"{where}: Extra inputs are not permitted") if where else None

    def count(self, body: Any) -> int:
        return self.counter.count_request(body)

    def units(self, body: Any) -> list[Unit]:
        return prompt_units(body, self.counter)

    def too_long(self, tokens: int, window: int) -> Refusal | None:
        message = window_error(tokens, window)
        return Refusal(400, INVALID, message) if message else None

    def read(self, body: Any) -> Prompt:
        return read(body)

    def streaming(self, body: Any) -> bool:
        return bool(body.get("stream"))

    def whole(self, body: Any, reply: Reply, usage: Usage) -> dict[str, Any]:
        return message(self.model(body), reply, usage)

    def events(self, body: Any, whole: dict[str, Any], chunk_tokens: int) -> list[Event]:
        return stream(whole, chunk_tokens)

    def recorded(self, whole: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        return whole["content"], whole["usage"]

    def stream_error(self, events: list[Event]) -> Event:
        return STREAM_ERROR


def deferral_field(body: Any) -> str | None:
    """Where a Messages body defers a tool (`tools.N.custom.defer_loading`) or loads one
    (`messages.N.content.M.tool_result.content.K.tool_reference`), as the API's error
    names a field it does not take; None: nowhere."""
    tools = body.get("tools")
    for n, tool in enumerate(tools if isinstance(tools, list) else []):
        if isinstance(tool, dict) and "defer_loading" in tool:
            return f"tools.{n}.custom.defer_loading"
    for n, message in enumerate(body.get("messages") or []):
        for m, block in enumerate(_blocks(message.get("content"))):
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            for k, inner in enumerate(_blocks(block.get("content"))):
                if isinstance(inner, dict) and inner.get("type") == "tool_reference":
                    return f"messages.{n}.content.{m}.tool_result.content.{k}.tool_reference"
    return None


class EnvelopedMessages(MessagesApi):
    """Messages as a cloud carries it (Bedrock, Vertex): the model in the path, not the
    body; the platform checks the credential itself (no `gate`); the envelope's own fields
    are not the Messages API's; the answer names the model by its Anthropic name."""

    envelope_fields: tuple[str, ...] = ("anthropic_version",)

    def __init__(self, counter: TokenCounter, cloud: str, model: str) -> None:
        super().__init__(counter)
        self.model_id = model
        self.name = f"{cloud} {model}"  # the answer depends on the path's model

    def gate(self, headers: Mapping[str, str]) -> Refusal | None:
        return None

    def as_messages(self, body: Any) -> Any:
        if not isinstance(body, dict):
            return body
        plain = {k: v for k, v in body.items() if k not in self.envelope_fields}
        return {"model": anthropic_name(self.model_id), **plain}

    def count(self, body: Any) -> int:
        return super().count(self.as_messages(body))

    def model(self, body: Any) -> str:
        return self.model_id

    def whole(self, body: Any, reply: Reply, usage: Usage) -> dict[str, Any]:
        return {**super().whole(body, reply, usage), "model": anthropic_name(self.model_id)}


async def handle_messages(request: web.Request) -> web.StreamResponse:
    return await serve(request, MessagesApi(request.app[COUNTER]))


def counted(body: Any) -> Checked:
    message = validate_count_tokens_request(body)
    return body, Refusal(400, INVALID, message) if message else None


async def handle_count_tokens(request: web.Request) -> web.Response:
    api = MessagesApi(request.app[COUNTER])
    refusal = api.gate(request.headers)
    if refusal is not None:
        return api.refuse(refusal, request_id(request))
    return await count_tokens(request, api, counted, lambda n: {"input_tokens": n})


def _model(model_id: str, name: str, created: str) -> dict[str, str]:
    return {"type": "model", "id": model_id, "display_name": name, "created_at": created}


async def handle_models(request: web.Request) -> web.Response:
    if api_gemini.api_key(request) is not None:
        # The Gemini API lists its models here too (google-genai's default version is v1).
        return await api_gemini.handle_models(request)
    api = MessagesApi(request.app[COUNTER])
    refusal = api.gate(request.headers)
    if refusal is not None:
        return api.refuse(refusal, request_id(request))
    model_id = request.match_info.get("model_id")
    if model_id is None:
        data = [_model(*m) for m in MODELS]
        listing = {
            "data": data,
            "has_more": False,
            "first_id": data[0]["id"],
            "last_id": data[-1]["id"],
        }
        return web.Response(body=orjson.dumps(listing), content_type="application/json")
    for m in MODELS:
        if m[0] == model_id:
            return web.Response(body=orjson.dumps(_model(*m)), content_type="application/json")
    return api_error(404, "not_found_error", f"model: {model_id}", request_id(request))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/messages", handle_messages)
    app.router.add_post("/v1/messages/count_tokens", handle_count_tokens)
    app.router.add_get("/v1/models", handle_models)
    app.router.add_get("/v1/models/{model_id}", handle_models)
