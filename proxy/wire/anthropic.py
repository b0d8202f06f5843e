"""Anthropic Messages as a `WireFormat` (proxy/core/wire_format.py).

Decoding never copies or normalises a message: the planners work on `Shape`s and
indices, and encoding puts the original message objects (or the few rewritten ones) back
in a copy of the original body, so unknown fields, roles and block types pass through
unchanged (DESIGN invariant 5). read_result rounds: proxy/wire/anthropic_rounds.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from proxy.core import model_facts, offload, summary
from proxy.core.errors import ProxyError
from proxy.core.history import Shape
from proxy.core.offload import Stub
from proxy.core.tokens import TokenCounter, loaded_tools
from proxy.core.usage import LineKind, Usage, anthropic_usage
from proxy.core.wire_format import JSON, MessageCounter, Round, RoundMerger
from proxy.wire import anthropic_rounds

Message = Mapping[str, Any]

_START = b'data: {"type":"message_start"'
_DELTA = b'data: {"type":"message_delta"'
_TEXT = b'data: {"type":"content_block_delta"'
_DELTA_OVERHEAD = 72  # bytes of JSON around a text delta's text


def message_shape(message: Message, tokens: int) -> Shape:
    """The shape of one message: tool_use ids an assistant makes, tool_result ids a user gives."""
    role = str(message.get("role", ""))
    content = message.get("content")
    if not isinstance(content, list):
        return Shape(role, tokens)
    if role == "assistant":
        calls = tuple(
            str(b.get("id")) for b in content if isinstance(b, dict) and b.get("type") == "tool_use"
        )
        return Shape(role, tokens, calls=calls)
    if role == "user":
        answers = tuple(
            str(b.get("tool_use_id"))
            for b in content
            if isinstance(b, dict) and b.get("type") == "tool_result"
        )
        return Shape(role, tokens, answers=answers)
    return Shape(role, tokens)


def history_shapes(
    messages: Sequence[Message], count_message: Callable[[Message], int]
) -> list[Shape]:
    return [message_shape(m, count_message(m)) for m in messages]


def request_messages(body: Mapping[str, Any]) -> list[JSON]:
    """The request's messages, or [] when the field is absent or not a list."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    return [m for m in messages if isinstance(m, dict)]


def encode_request(body: Mapping[str, Any], **replace: Any) -> bytes:
    """The body with some top-level fields replaced (key order kept), as JSON bytes.

    A field replaced with None is removed. New fields go at the end, so the same inputs
    always give the same bytes.
    """
    out = dict(body)
    for key, value in replace.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return orjson.dumps(out)


def max_output(body: Mapping[str, Any]) -> int | None:
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def error_payload(error_type: str, message: str, request_id: str) -> JSON:
    return {
        "type": "error",
        "error": {"type": error_type, "message": message},
        "request_id": request_id,
    }


def stream_error_event(error_type: str, message: str) -> bytes:
    """An SSE `event: error` in the API's shape, to end a stream the proxy must cut."""
    data = orjson.dumps({"type": "error", "error": {"type": error_type, "message": message}})
    return b"event: error\ndata: " + data + b"\n\n"


class AnthropicMessages:
    """POST /v1/messages (and count_tokens): Anthropic's Messages API."""

    name = "anthropic"
    request_id_header = "request-id"

    # -- decoding and encoding ---------------------------------------------------------

    def messages(self, body: Mapping[str, Any]) -> list[JSON]:
        return request_messages(body)

    def encode(self, body: Mapping[str, Any], replace: Mapping[str, Any]) -> bytes:
        return encode_request(body, **replace)

    def with_history(self, body: Mapping[str, Any], messages: list[JSON], tool: str | None) -> JSON:
        fields: JSON = {"messages": messages}
        if tool:
            tools = body.get("tools")
            fields["tools"] = [
                *(tools if isinstance(tools, list) else []),
                self.read_result_tool(tool),
            ]
        return fields

    # -- counting and identity ---------------------------------------------------------

    def counter(self, base: TokenCounter) -> MessageCounter:
        return base

    def fixed_tokens(self, counter: MessageCounter, body: Mapping[str, Any]) -> int:
        system = body.get("system")
        system_tokens = counter.count_content(system) if system else 0
        # Deferred tools (tool search) count once a tool_reference loads them.
        return system_tokens + counter.count_tools(
            loaded_tools(body.get("tools"), body.get("messages"))
        )

    def tool_name(self, body: Mapping[str, Any]) -> str | None:
        return offload.choose_tool_name(body.get("tools"))

    def identity_view(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        return body

    def max_output(self, body: Mapping[str, Any]) -> int | None:
        return max_output(body)

    # -- the planner's view (Dialect) --------------------------------------------------

    def message_shape(self, message: Message, tokens: int) -> Shape:
        return message_shape(message, tokens)

    def tool_results(self, message: Message) -> list[tuple[int, Mapping[str, Any]]]:
        """tool_result blocks of a user message, by block index."""
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            return []
        return [
            (b, block)
            for b, block in enumerate(content)
            if isinstance(block, dict) and block.get("type") == "tool_result"
        ]

    def stubbed_message(
        self, message: Message, stubs: Sequence[Stub], tool: str, read_length: int
    ) -> JSON:
        return offload.stubbed_message(message, stubs, tool, read_length)

    def summary_message(self, text: str, folded: int) -> JSON:
        return summary.summary_message(text, folded)

    def note_message(self, text: str) -> JSON:
        return summary.note_message(text)

    def render_transcript(self, messages: Sequence[Message]) -> str:
        return summary.render_transcript(messages)

    def read_result_tool(self, name: str) -> JSON:
        return offload.read_result_tool(name)

    def with_breakpoint(self, message: Message) -> JSON | None:
        content = message.get("content")
        if not isinstance(content, list) or not content or not isinstance(content[-1], dict):
            return None
        if any(isinstance(b, dict) and "cache_control" in b for b in content):
            return None  # the client's own breakpoint: never moved
        last = {**content[-1], "cache_control": {"type": "ephemeral"}}
        return {**message, "content": [*content[:-1], last]}

    def breakpoints(self, body: Mapping[str, Any]) -> int:
        # A key of the JSON: inside a string its quotes would be escaped.
        outside = (body.get("system"), body.get("tools"))
        return orjson.dumps(outside).count(b'"cache_control"')

    # -- the summariser ----------------------------------------------------------------

    def summary_request(
        self,
        body: Mapping[str, Any],
        *,
        model: str,
        slot: int,
        prompt: str,
        history: Sequence[JSON] | None,
    ) -> JSON | None:
        if history is None:
            return {
                "model": model,
                "max_tokens": slot,
                "system": summary.INSTRUCTION,
                "messages": [{"role": "user", "content": prompt}],
            }
        choice = body.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") in ("any", "tool"):
            return None  # the model would have to call a tool, not write notes
        out = {k: v for k, v in body.items() if k != "stream"}
        asked = {"role": "user", "content": [{"type": "text", "text": prompt}]}
        out["messages"] = [*history, asked]
        # Thinking stays as the conversation has it (changing it would miss the cache);
        # a thinking budget comes on top of the notes' slot.
        thinking = body.get("thinking")
        budget = None
        if isinstance(thinking, dict) and thinking.get("type") == "enabled":
            budget = thinking.get("budget_tokens")
        extra = budget if isinstance(budget, int) else 0
        out["max_tokens"] = slot + extra
        # Never above the model's max output (the API would refuse it), while the thinking
        # budget still leaves room for notes.
        limit = model_facts.max_output(model)
        if limit and slot + extra > limit > extra:
            out["max_tokens"] = limit
        return out

    def answer_text(self, answer: JSON) -> str:
        content = answer.get("content")
        blocks = content if isinstance(content, list) else []
        return "".join(
            str(b.get("text", ""))
            for b in blocks
            if isinstance(b, dict) and b.get("type") == "text"
        )

    # -- read_result rounds ------------------------------------------------------------

    def split(self, answer: JSON, tool: str) -> Round:
        return anthropic_rounds.split_message(answer, tool)

    def merge(self, answers: Sequence[JSON], tool: str, note: str | None = None) -> JSON:
        return anthropic_rounds.merge_messages(answers, tool, note)

    def continue_messages(
        self, messages: Sequence[JSON], round_: Round, results: Sequence[tuple[str, str, bool]]
    ) -> list[JSON]:
        return anthropic_rounds.continue_messages(messages, round_, results)

    def merger(self, tool: str) -> RoundMerger:
        return anthropic_rounds.StreamMerger(tool)

    # -- usage -------------------------------------------------------------------------

    def usage(self, raw: Mapping[str, Any]) -> Usage:
        return anthropic_usage(raw)

    def line_may_matter(self, head: bytes) -> bool:
        return head.startswith((_START, _DELTA))

    def usage_line(self, line: bytes) -> tuple[LineKind, Usage] | None:
        if line.startswith(_START):
            message = _data(line).get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            return LineKind.START, anthropic_usage(usage if isinstance(usage, dict) else {})
        if line.startswith(_DELTA):
            usage = _data(line).get("usage")
            if isinstance(usage, dict):
                return LineKind.END, anthropic_usage(usage)
        return None

    def text_chars(self, line: bytes) -> int:
        return max(0, len(line) - _DELTA_OVERHEAD) if line.startswith(_TEXT) else 0

    def body_usage(self, body: Mapping[str, Any]) -> Usage | None:
        usage = body.get("usage")
        return anthropic_usage(usage) if isinstance(usage, dict) else None

    # -- errors ------------------------------------------------------------------------

    def error_body(self, error: ProxyError, request_id: str) -> bytes:
        return orjson.dumps(error_payload(error.type, error.message, request_id))

    def stream_error(self, error: ProxyError) -> bytes:
        return stream_error_event(error.type, error.message)

    def upstream_stream_error(self, payload: object, status: int) -> bytes:
        error = payload.get("error") if isinstance(payload, dict) else None
        if not isinstance(error, dict):
            return stream_error_event("api_error", f"upstream answered {status}")
        return stream_error_event(str(error.get("type", "api_error")), str(error.get("message")))


def _data(line: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(line[5:])
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


ANTHROPIC = AnthropicMessages()
