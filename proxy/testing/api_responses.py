"""The stand-in's OpenAI Responses API (`POST /v1/responses`; its WebSocket: responses_ws.py).

What is the Responses API's own (the rest is every API's: answering.py):

- a Bearer credential and OpenAI's error shape (api_chat.py's); validation by
  responses_validate.py; sealed reasoning/compaction content that was changed is refused
  (responses_items.py);
- a window exceeded: with `stream: true` the API answers 200 and reports it in the stream
  (`response.created`, `response.in_progress`, an `error` event with code
  `context_length_exceeded`, `response.failed`); without, a 400. `overflow="status"`
  answers 400 on streams too;
- answers (responses_events.py): a reasoning item when `reasoning` is set (its model
  thinks by default; sealed `encrypted_content` when `include` asks for it), then the text
  as an assistant message, then the calls: a `custom_tool_call` when the named tool is a
  `custom` tool (script `tool.input.input` is its text), else a `function_call` (ids
  derive from the request: same request, same answer);
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

import contextlib
import functools
import hashlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from proxy.core.tokens import TokenCounter
from proxy.testing.answering import serve
from proxy.testing.api import Event, Refusal
from proxy.testing.api_chat import OpenAIApi, invalid, openai_error, openai_gate
from proxy.testing.cache import Unit
from proxy.testing.codex_scenario import Scenario
from proxy.testing.prompt import COMPACTION, SUMMARY, TURN, Entry, Part, Prompt, Result, Text
from proxy.testing.reply import Call, Reply, Usage
from proxy.testing.responses_events import (
    error_event,
    failed_events,
    response_object,
    stream_error_position,
    stream_events,
    usage_object,
)
from proxy.testing.responses_items import (
    ItemCounter,
    check_seals,
    offered_custom,
    seal,
    sealed_text,
)
from proxy.testing.standin_http import COUNTER, request_digest
from proxy.wire.responses_units import input_items, part_texts
from proxy.wire.responses_validation import validate_responses_request, window_error

REASONS = {"thinking": True}
HANDOFF = re.compile(r"checkpoint compaction|handoff summary", re.IGNORECASE)
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


def _entry(item: dict[str, Any], key: bytes) -> Entry | None:
    kind = item.get("type", "message")
    parts: tuple[Part, ...]
    if kind == "message":
        role = str(item.get("role"))
        role = role if role in ("user", "assistant") else "system"
        return Entry(role, tuple(Text(t) for t in part_texts(item.get("content"))))
    if kind in ("function_call", "custom_tool_call"):
        given = item.get("arguments", item.get("input"))
        if kind == "function_call":
            with contextlib.suppress(orjson.JSONDecodeError, TypeError):
                given = orjson.loads(given or "{}")
        parts = (Call(str(item.get("name")), given, str(item.get("call_id"))),)
        return Entry("assistant", parts)
    if kind in ("function_call_output", "custom_tool_call_output"):
        parts = (Result(str(item.get("call_id")), tuple(part_texts(item.get("output")))),)
        return Entry("user", parts)
    if kind in ("reasoning", "compaction"):
        sealed = sealed_text(item, key)
        return Entry("assistant", (Text(sealed),)) if sealed else None
    return None


def _tool_names(tools: Any) -> tuple[str, ...]:
    names = []
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict):
            continue
        members = tool.get("tools") if tool.get("type") == "namespace" else [tool]
        for member in members if isinstance(members, list) else ():
            if isinstance(member, dict) and isinstance(member.get("name"), str):
                names.append(member["name"])
    return tuple(names)


def _asks(body: dict[str, Any], items: list[Any]) -> str:
    last = items[-1] if items else None
    if isinstance(last, dict) and last.get("type") == "compaction_trigger":
        return COMPACTION
    if body.get("tools") == []:
        for item in reversed(items):  # the newest message: the user's asking for a handoff
            if isinstance(item, dict) and item.get("type", "message") == "message":
                text = "\n".join(part_texts(item.get("content")))
                if item.get("role") == "user" and HANDOFF.search(text):
                    return SUMMARY
                break
    return TURN


def _entries(items: list[Any], key: bytes) -> Iterator[Entry]:
    for item in items:
        entry = _entry(item, key) if isinstance(item, dict) else None
        if entry is not None:
            yield entry


def read(body: dict[str, Any], key: bytes) -> Prompt:
    """A Responses body as the script reads it: an item is an entry (sealed items as the
    text they stand for)."""
    items = input_items(body)
    limit = body.get("max_output_tokens")
    return Prompt(
        functools.partial(_entries, items, key),
        len(items),
        _tool_names(body.get("tools")),
        int(limit or DEFAULT_MAX_OUTPUT),
        int(limit or 1024),
        isinstance(body.get("reasoning"), dict),
        _asks(body, items),
    )


def _item_id(prefix: str, digest: str, n: int = 0) -> str:
    """An output item's id: its suffix is the response's, so the item a reasoning item led
    to is known by it (proxy/wire/responses_validation.py)."""
    return f"{prefix}{n if n else ''}_{digest[:32]}"


def output_items(body: dict[str, Any], reply: Reply, key: bytes) -> list[dict[str, Any]]:
    d = reply.digest
    if reply.compaction is not None:
        folded = len(input_items(body)) - 1  # all but the trigger
        sealed = seal({"kind": "compaction", "text": reply.compaction, "items": folded}, key)
        return [{"id": _item_id("cmp", d), "type": "compaction", "encrypted_content": sealed}]
    out: list[dict[str, Any]] = []
    if reply.thinking:
        item: dict[str, Any] = {"id": _item_id("rs", d), "type": "reasoning", "summary": []}
        if "reasoning.encrypted_content" in (body.get("include") or ()):
            item["encrypted_content"] = seal({"kind": "reasoning", "text": reply.thinking}, key)
        out.append(item)
    if reply.text:
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": reply.text}
        out.append({"id": _item_id("msg", d), "type": "message", "status": "completed",
                    "role": "assistant", "content": [part]})  # fmt: skip
    for n, call in enumerate(reply.calls):
        call_id = call.id or f"call_{d[32:56]}" + (f"{n}" if n else "")
        if offered_custom(body, call.name):
            given = call.input
            raw = given.get("input") if isinstance(given, dict) else given
            text = raw if isinstance(raw, str) else orjson.dumps(given).decode()
            out.append({"id": _item_id("ctc", d, n), "type": "custom_tool_call",
                        "status": "completed", "call_id": call_id, "name": call.name,
                        "input": text})  # fmt: skip
        else:
            out.append({"id": _item_id("fc", d, n), "type": "function_call",
                        "status": "completed", "arguments": orjson.dumps(call.input).decode(),
                        "call_id": call_id, "name": call.name})  # fmt: skip
    return out


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


class ResponsesApi(OpenAIApi):
    name = "responses"
    defaults = REASONS  # its models reason whenever `reasoning` is set

    def __init__(self, options: ResponsesOptions, counter: TokenCounter) -> None:
        self.options = options
        self.counter = ItemCounter(counter, options.seal_key)

    def invalid(self, body: Any) -> Refusal | None:
        refusal = invalid(validate_responses_request(body, openai=self.options.plays_openai))
        if refusal is not None:
            return refusal
        options = self.options
        unverified = check_seals(body, options.seal_key, options.accept_foreign_encrypted)
        if unverified is None:
            return None
        message = f"The encrypted content for item {unverified} could not be verified."
        return Refusal(400, "invalid_request_error", message, "input", "invalid_encrypted_content")

    def count(self, body: Any) -> int:
        return self.counter.count_request(body)

    def units(self, body: Any) -> list[Unit]:
        return self.counter.prompt_units(body)

    def too_long(self, tokens: int, window: int) -> Refusal | None:
        return invalid(window_error(tokens, window))

    def read(self, body: Any) -> Prompt:
        return read(body, self.options.seal_key)

    def whole(self, body: Any, reply: Reply, usage: Usage) -> dict[str, Any]:
        head = {"id": f"resp_{reply.digest[:32]}", "model": self.model(body)}
        items = output_items(body, reply, self.options.seal_key)
        status = "incomplete" if reply.cut else "completed"
        incomplete = "max_output_tokens" if reply.cut else None
        return response_object(head, body, items, status, usage_object(usage), incomplete)

    def events(self, body: Any, whole: dict[str, Any], chunk_tokens: int) -> list[Event]:
        return stream_events(whole, chunk_tokens)

    def recorded(self, whole: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        return whole["output"], whole["usage"]

    def stream_error(self, events: list[Event]) -> Event:
        return error_event(stream_error_position(events), STREAM_FAULT)

    def overflow(self, body: Any, refusal: Refusal) -> list[Event] | None:
        if self.options.overflow != "stream":
            return None
        head = {"id": f"resp_{request_digest(body, self.ignored)[:32]}", "model": self.model(body)}
        error = {"type": refusal.kind, "code": refusal.code, "message": refusal.message,
                 "param": refusal.param}  # fmt: skip
        return failed_events(response_object(head, body, [], "failed", None), error)

    def response_headers(
        self, headers: Mapping[str, str], whole: dict[str, Any] | None
    ) -> Mapping[str, str]:
        return turn_state(headers, self.options)

    def scripted(self, prompt: Prompt) -> Mapping[str, Any]:
        scenario = self.options.scenario
        return scenario.script(prompt) if scenario is not None else {}

    def summary_note(self, prompt: Prompt) -> str:
        scenario = self.options.scenario
        return scenario.summary_note(prompt) if scenario is not None else ""


async def handle_responses(request: web.Request) -> web.StreamResponse:
    return await serve(request, ResponsesApi(request.app[RESPONSES], request.app[COUNTER]))


async def handle_responses_get(request: web.Request) -> web.Response:
    """A WebSocket upgrade (Codex's first try) or a plain GET, when neither is served."""
    upgrade = request.headers.get("upgrade", "").lower() == "websocket"
    refusal = openai_gate(request.headers)
    if refusal is not None:
        return openai_error(refusal)
    status = request.app[RESPONSES].websocket_status if upgrade else 404
    if status == 426:
        message = (
            "WebSocket connections to /v1/responses are not supported by this server;"
            " use HTTP POST."
        )
        return openai_error(
            Refusal(426, "invalid_request_error", message, code="websocket_not_supported")
        )
    return openai_error(
        Refusal(status, "invalid_request_error", f"Invalid URL (GET {request.path})")
    )


def add_routes(app: web.Application) -> None:
    app[RESPONSES] = ResponsesOptions()
    app.router.add_post("/v1/responses", handle_responses)
    # GET /v1/responses: responses_ws.py (served with websocket_status 101, else refused here)
