"""Anthropic Messages: map a request onto the neutral history model, and back.

Decoding never copies or normalises a message: the planners work on `Shape`s and
indices, and encoding puts the original message objects (or the few rewritten ones) back
in a copy of the original body, so unknown fields, roles and block types pass through
unchanged (DESIGN invariant 5).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from proxy.core import offload, summary
from proxy.core.history import Shape
from proxy.core.offload import Stub

Message = Mapping[str, Any]


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


def request_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
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


class AnthropicDialect:
    """The planner's view of Messages requests (see proxy/core/dialect.py)."""

    name = "anthropic"

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
    ) -> dict[str, Any]:
        return offload.stubbed_message(message, stubs, tool, read_length)

    def summary_message(self, text: str, folded: int) -> dict[str, Any]:
        return summary.summary_message(text, folded)

    def note_message(self, text: str) -> dict[str, Any]:
        return summary.note_message(text)

    def render_transcript(self, messages: Sequence[Message]) -> str:
        return summary.render_transcript(messages)

    def read_result_tool(self, name: str) -> dict[str, Any]:
        return offload.read_result_tool(name)


ANTHROPIC = AnthropicDialect()
