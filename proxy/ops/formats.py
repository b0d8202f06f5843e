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


def chat_evidence(body: Mapping[str, Any]) -> str | None:
    """What in the body only OpenAI Chat Completions has, in words; None if nothing."""
    for name in _CHAT_ONLY_FIELDS:
        if name in body:
            return f"the field {name}"
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and tool.get("type") == "function" and "function" in tool:
            return 'a {"type": "function"} tool'
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    for m in messages:
        if isinstance(m, dict) and m.get("role") in ("tool", "developer"):
            return f"a {m['role']} message"
        if isinstance(m, dict) and "tool_calls" in m:
            return "an assistant's tool_calls"
    first = messages[0] if messages else None
    if isinstance(first, dict) and first.get("role") == "system" and "system" not in body:
        return "a system message first and no top-level system"
    return None


def looks_like_chat(body: Mapping[str, Any]) -> bool:
    return chat_evidence(body) is not None


_ANTHROPIC_ONLY_FIELDS = ("system", "top_k", "stop_sequences", "thinking")
_ANTHROPIC_ONLY_BLOCKS = ("tool_use", "tool_result", "thinking", "redacted_thinking")


def anthropic_evidence(body: Mapping[str, Any]) -> str | None:
    """What in the body only Anthropic Messages has, in words; None if nothing."""
    for name in _ANTHROPIC_ONLY_FIELDS:
        if name in body:
            return f"the field {name}"
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and "input_schema" in tool:
            return "a tool with input_schema"
    messages = body.get("messages")
    for m in messages if isinstance(messages, list) else []:
        content = m.get("content") if isinstance(m, dict) else None
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") in _ANTHROPIC_ONLY_BLOCKS:
                return f"a {block['type']} block"
    return None


def format_mismatch(name: str, body: Mapping[str, Any]) -> str | None:
    """A warning when `--format NAME`, forced, does not fit the body; None if it fits
    (or was `auto`)."""
    responses = "input" in body and "messages" not in body
    evidence: str | None
    if name in ("anthropic", "chat") and responses:
        evidence, other = "an input field and no messages", "OpenAI Responses"
    elif name == "responses" and not responses:
        evidence, other = "a messages field", "Anthropic Messages or OpenAI Chat Completions"
    elif name == "anthropic":
        evidence, other = chat_evidence(body), "OpenAI Chat Completions"
    elif name == "chat":
        evidence, other = anthropic_evidence(body), "Anthropic Messages"
    else:
        return None
    if evidence is None:
        return None
    return (
        f"--format {name}, but the request looks like {other} ({evidence});"
        f" read as {name} anyway (--format auto tells them apart)"
    )


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
