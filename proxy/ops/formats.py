"""Which wire format a saved request is in, for `plan` and `replay --format`.

`auto` looks at the body for what only OpenAI Chat Completions has: a `tool` or
`developer` message, an assistant's `tool_calls`, function tools
(`{"type": "function", "function": ...}`), Chat-only fields (`max_completion_tokens`,
`stream_options`, `n`, `response_format`, ...), or a system prompt sent as the first
message with no top-level `system`. Any of them: Chat; none: Anthropic Messages (a plain
user/assistant text exchange counts almost the same either way). A trace is judged by its
first request, so a Chat trace whose first request shows none of these needs
`--format chat`. A body with `input` and no `messages` is the Responses API's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.core.wire_format import WireFormat
from proxy.wire import ANTHROPIC, CHAT, RESPONSES

FORMAT_CHOICES = ("auto", "anthropic", "chat", "responses")
_CHAT_ONLY_FIELDS = (
    "max_completion_tokens",
    "stream_options",
    "n",
    "response_format",
    "parallel_tool_calls",
    "logprobs",
    "frequency_penalty",
    "presence_penalty",
    "reasoning_effort",
)


def looks_like_chat(body: Mapping[str, Any]) -> bool:
    if any(name in body for name in _CHAT_ONLY_FIELDS):
        return True
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and tool.get("type") == "function" and "function" in tool:
            return True
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    for m in messages:
        if isinstance(m, dict) and (m.get("role") in ("tool", "developer") or "tool_calls" in m):
            return True
    first = messages[0] if messages else None
    return isinstance(first, dict) and first.get("role") == "system" and "system" not in body


def format_for(name: str, body: Mapping[str, Any] | None) -> WireFormat:
    """The wire format `--format NAME` asks for; `auto` judges `body`."""
    if name == "chat":
        return CHAT
    if name == "anthropic":
        return ANTHROPIC
    if name == "responses":
        return RESPONSES
    if name != "auto":
        raise ValueError(f"unknown format {name!r}; known: {', '.join(FORMAT_CHOICES)}")
    if body is not None and "input" in body and "messages" not in body:
        return RESPONSES
    return CHAT if body is not None and looks_like_chat(body) else ANTHROPIC
