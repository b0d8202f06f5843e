"""OpenAI Chat Completions as a `WireFormat` (proxy/core/wire_format.py), made of its
parts: `ChatRequest`, `ChatDialect`, `ChatSummaries`, `ChatUsage`, `ChatErrors` here, and
`ChatRounds` (read_result rounds) in proxy/wire/chat_rounds.py.

Like the Messages format, decoding never copies or normalises messages: the planner
works on shapes and indices and puts the original message objects (or the few rewritten
ones) back, so unknown fields and roles pass through (docs/design.md#unknown-passes-through).

How Chat messages map onto the neutral model:
- an assistant message with `tool_calls` and the `tool` messages answering them are one
  group. A tool message's shape keeps its role "tool" and names the call it answers, so
  one that answers no call is malformed (dropped) rather than pinned like an unknown role;
- `system` and `developer` messages are pinned (they are not ordinary roles);
- a tool message holds one result (block 0): a string or a list of text parts. A stub
  replaces its content; summaries and drop notes are `user` messages with string content.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.core import offload, summary
from proxy.core.errors import ProxyError
from proxy.core.history import Shape
from proxy.core.offload import ToolResult
from proxy.core.policy import PREFIX_CACHED_BATCH
from proxy.core.tokens import MESSAGE_OVERHEAD, TOOL_FRAMING, TokenCounter
from proxy.core.usage import DATA_LINES, LineKind, Usage
from proxy.core.validated import Validated
from proxy.core.wire_format import JSON, IdentityView, MessageCounter
from proxy.wire.chat_rounds import ChatRounds, chat_usage
from proxy.wire.chat_validation import validate_chat_request
from proxy.wire.common import (
    FormatCounter,
    head_text,
    listed_already,
    max_output,
    never_deferred,
    openai_error,
    request_messages,
)

Message = Mapping[str, Any]
PINNED_ROLES = ("system", "developer")


def message_shape(message: Message, tokens: int) -> Shape:
    role = str(message.get("role", ""))
    if role == "assistant":
        calls = message.get("tool_calls")
        ids = tuple(
            str(c.get("id")) for c in calls or () if isinstance(c, dict) and c.get("id") is not None
        )
        return Shape(role, tokens, calls=ids)
    if role == "tool":
        return Shape(role, tokens, answers=(str(message.get("tool_call_id")),))
    return Shape(role, tokens)


def read_result_tool(name: str) -> dict[str, Any]:
    """The injected tool as a Chat function tool: the same bytes every time."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": offload.READ_RESULT_DESCRIPTION,
            "parameters": offload.read_result_schema(),
        },
    }


def tool_names(tools: object) -> set[str]:
    """Names of the request's function tools (and of any tool that names itself)."""
    names: set[str] = set()
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.add(function["name"])
        if isinstance(tool.get("name"), str):
            names.add(tool["name"])
    return names


def choose_tool_name(tools: object) -> str | None:
    """The first read_result name the client does not use itself (None: offload off)."""
    return offload.free_tool_name(tool_names(tools))


def render_transcript(messages: Sequence[Message]) -> str:
    """The folded messages as plain text for the summariser."""
    parts = []
    for message in messages:
        role = str(message.get("role", "?"))
        lines: list[str] = []
        text = _parts_text(message.get("content"))
        if role == "tool":
            lines.append(f"[tool result id={message.get('tool_call_id')}]\n{text}")
        elif text:
            lines.append(text)
        for call in message.get("tool_calls") or ():
            if not isinstance(call, dict):
                continue
            function = call.get("function") or {}
            lines.append(
                f"[tool call {function.get('name')} id={call.get('id')}]"
                f" {function.get('arguments', '')}"
            )
        body = "\n".join(line for line in lines if line)
        if body:
            parts.append(f"## {role}\n{body}")
    return "\n\n".join(parts)


def _parts_text(content: object) -> str:
    if isinstance(content, str):
        return content
    out = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text":
            out.append(str(part.get("text", "")))
        elif isinstance(part.get("type"), str):
            out.append(f"[{part['type']}]")
    return "\n".join(out)


def identity_view(body: Mapping[str, Any]) -> IdentityView:
    """What identifies a Chat conversation: the leading system/developer messages, then
    the first other message (the system prompt alone is shared by many)."""
    messages = request_messages(body)
    lead = 0
    while lead < len(messages) and messages[lead].get("role") in PINNED_ROLES:
        lead += 1
    first = messages[lead] if lead < len(messages) else None
    return IdentityView(messages[:lead], first, metadata=body.get("metadata"))


# -- counting -----------------------------------------------------------------------------


class ChatCounter(FormatCounter):
    """Token estimates for Chat messages, on top of the shared block counter (and its
    cache): a message costs its content, its tool calls' names and argument text, and a
    tool message its framing. Estimates, like the Anthropic ones; calibration corrects."""

    def count_message(self, message: Mapping[str, Any]) -> int:
        if not isinstance(message, dict):
            return MESSAGE_OVERHEAD + self.base.count_json(message)
        total = MESSAGE_OVERHEAD + self.base.count_content(message.get("content"))
        if message.get("role") == "tool":
            total += TOOL_FRAMING
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                total += self.base.count_json(call)
                continue
            name, arguments = function.get("name"), function.get("arguments")
            total += TOOL_FRAMING + (self.base.count_text(name) if isinstance(name, str) else 0)
            if isinstance(arguments, str):
                total += self.base.count_text(arguments)
            else:
                total += self.base.count_json(arguments)
        return total

    def count_request(self, body: Mapping[str, Any]) -> int:
        return self.count_tools(body.get("tools")) + sum(
            self.count_message(m) for m in request_messages(body)
        )


# -- errors -------------------------------------------------------------------------------


def error_body(
    message: str, error_type: str, *, param: str | None = None, code: str | None = None
) -> bytes:
    """An error in the Chat API's shape."""
    return orjson.dumps(
        {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    )


def stream_error_event(message: str, error_type: str, code: str | None = None) -> bytes:
    """An error inside a stream after the 200: a data line the openai SDK raises on."""
    return b"data: " + error_body(message, error_type, code=code) + b"\n\n"


_USAGE = b'"usage":{'


class ChatRequest:
    """What a Chat Completions request is (`Request`)."""

    name = "chat"
    history_field = "messages"

    messages = staticmethod(request_messages)
    max_output = staticmethod(max_output)
    identity_view = staticmethod(identity_view)

    deferred = staticmethod(never_deferred)
    listed = staticmethod(listed_already)

    def with_history(
        self,
        body: Mapping[str, Any],
        messages: list[JSON],
        tool: str | None,
        tool_search: bool = False,  # (Messages only: the tool is listed here)
    ) -> JSON:
        fields: JSON = {"messages": messages}
        if tool:
            tools = body.get("tools")
            listed = tools if isinstance(tools, list) else []
            fields["tools"] = [*listed, read_result_tool(tool)]
        return fields

    def counter(self, base: TokenCounter) -> MessageCounter:
        return ChatCounter(base)

    def fixed_tokens(self, counter: MessageCounter, body: Mapping[str, Any]) -> int:
        return counter.count_tools(body.get("tools"))

    def tool_name(self, body: Mapping[str, Any]) -> str | None:
        n = body.get("n")
        if n not in (None, 1):
            return None  # several choices: the rounds follow one, so offload stays off
        return choose_tool_name(body.get("tools"))

    def breakpoints(self, body: Mapping[str, Any]) -> int:
        return 0  # OpenAI caches prompt prefixes without breakpoints

    def request_error(
        self, body: Mapping[str, Any], model: str, memo: Validated | None = None
    ) -> str | None:
        invalid = validate_chat_request(body)
        return invalid.message if invalid is not None else None


class ChatDialect:
    """How the planner sees a Chat history and what it writes into one (`Dialect`)."""

    offload_batch = PREFIX_CACHED_BATCH  # OpenAI caches prompt prefixes by itself

    message_shape = staticmethod(message_shape)
    render_transcript = staticmethod(render_transcript)
    read_result_tool = staticmethod(read_result_tool)

    def loading_tokens(
        self, counter: MessageCounter, name: str, tools: object, tool_search: bool = False
    ) -> int:
        return 0  # the tool is listed, not deferred

    def head_text(self, message: Message) -> str:
        return head_text(message, render_transcript)

    def tool_results(self, message: Message) -> list[ToolResult]:
        if message.get("role") != "tool":
            return []
        content = message.get("content")
        return [ToolResult(0, message.get("tool_call_id"), content, offload.content_text(content))]

    def gives_results(self, message: Message) -> bool:
        return message.get("role") == "tool"  # (a tool message is one result)

    def with_results(self, message: Message, texts: Mapping[int, str]) -> JSON:
        out = dict(message)
        text = texts.get(0)  # (a tool message is one result: block 0)
        if text is not None:
            original = message.get("content")
            out["content"] = text if isinstance(original, str) else [{"type": "text", "text": text}]
        return out

    def summary_message(self, text: str, folded: int) -> JSON:
        return {"role": "user", "content": summary.summary_text(text, folded)}

    def note_message(self, text: str) -> JSON:
        return {"role": "user", "content": text}

    def with_breakpoint(
        self, messages: Sequence[JSON], at: int, uncached_tail: bool
    ) -> list[JSON] | None:
        return None  # OpenAI caches prompt prefixes without breakpoints


class ChatSummaries:
    """The summariser's call on Chat Completions (`Summaries`)."""

    def summary_request(
        self,
        body: Mapping[str, Any],
        *,
        model: str,
        summary_tokens: int,
        prompt: str,
        history: Sequence[JSON] | None,
    ) -> JSON | None:
        if history is None:
            return {
                "model": model,
                "max_completion_tokens": summary_tokens,
                "messages": [
                    {"role": "system", "content": summary.INSTRUCTION},
                    {"role": "user", "content": prompt},
                ],
            }
        choice = body.get("tool_choice")
        if choice == "required" or isinstance(choice, dict):
            return None  # the model would have to call a tool, not write notes
        dropped = ("stream", "stream_options", "n")
        out = {k: v for k, v in body.items() if k not in dropped}
        out["messages"] = [*history, {"role": "user", "content": prompt}]
        cap = (
            "max_tokens"
            if "max_tokens" in body and "max_completion_tokens" not in body
            else ("max_completion_tokens")
        )
        out[cap] = summary_tokens
        return out

    def answer_text(self, answer: JSON) -> str:
        choices = answer.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else {}
        message = first.get("message") if isinstance(first, dict) else None
        text = message.get("content") if isinstance(message, dict) else None
        return text if isinstance(text, str) else ""


class ChatUsage:
    """Usage in Chat answers, whole or streamed (`UsageReader`)."""

    lines = DATA_LINES

    usage = staticmethod(chat_usage)

    def line_may_matter(self, head: bytes) -> bool:
        # The usage chunk has no fixed prefix; content chunks are short, so look at each.
        return head.startswith(b"data: {")

    def usage_line(self, line: bytes) -> tuple[LineKind, Usage] | None:
        if _USAGE not in line:
            return None
        try:
            data = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            return None
        usage = data.get("usage") if isinstance(data, dict) else None
        if not isinstance(usage, dict):
            return None
        return LineKind.END, chat_usage(usage)

    def text_chars(self, line: bytes) -> int:
        return 0  # a Chat stream reports its usage only at its end, if asked to

    def body_usage(self, body: Mapping[str, Any]) -> Usage | None:
        usage = body.get("usage")
        return chat_usage(usage) if isinstance(usage, dict) else None


class ChatErrors:
    """Chat Completions' errors (`ErrorShapes`)."""

    request_id_header = "x-request-id"

    def error_body(self, error: ProxyError, request_id: str) -> bytes:
        return orjson.dumps({"error": openai_error(error)})

    def stream_error(self, error: ProxyError) -> bytes:
        return b"data: " + self.error_body(error, "") + b"\n\n"

    def upstream_stream_error(self, payload: object, status: int) -> bytes:
        error = payload.get("error") if isinstance(payload, dict) else None
        if not isinstance(error, dict):
            return stream_error_event(f"upstream answered {status}", "api_error")
        return b"data: " + orjson.dumps({"error": error}) + b"\n\n"


class ChatCompletions(ChatRequest, ChatDialect, ChatSummaries, ChatRounds, ChatUsage, ChatErrors):
    """POST /v1/chat/completions: OpenAI's Chat Completions API, made of its parts."""


CHAT = ChatCompletions()
