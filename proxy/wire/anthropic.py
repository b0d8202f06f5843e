"""Anthropic Messages as a `WireFormat` (proxy/core/wire_format.py), made of its parts:
`MessagesRequest`, `MessagesDialect`, `MessagesSummaries`, `MessagesUsage`,
`MessagesErrors` here, and `MessagesRounds` (read_result rounds) in
proxy/wire/anthropic_rounds.py.

Decoding never copies or normalises a message: the planners work on `Shape`s and
indices, and encoding puts the original message objects (or the few rewritten ones) back
in a copy of the original body, so unknown fields, roles and block types pass through
unchanged (docs/design.md#unknown-passes-through). The messages the proxy writes
(stubs, summaries, drop notes, the read_result tool) are built here, in the API's shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import orjson

from proxy.core import model_facts, offload, summary
from proxy.core.commands import GetSummary
from proxy.core.errors import ProxyError
from proxy.core.history import Shape
from proxy.core.offload import ToolResult
from proxy.core.tokens import TokenCounter, defers_tools, loaded_tools
from proxy.core.usage import LineKind, Usage, lines_starting
from proxy.core.validated import Validated
from proxy.core.wire_format import JSON, IdentityView, MessageCounter
from proxy.wire.anthropic_rounds import MessagesRounds, anthropic_usage
from proxy.wire.anthropic_validation import validate_messages_request
from proxy.wire.common import head_text, max_output, request_messages

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


def rewrapped(need: GetSummary, version: str) -> GetSummary:
    """The summariser's ask in a provider's envelope (Bedrock's, Vertex's): each body
    without `model` (the path names it) and with `anthropic_version` (`version` unless
    the body names one). An in-place body is the client's envelope already: it and its
    exact bytes stay as they are."""

    def enveloped(body: JSON) -> JSON:
        if "model" not in body and "anthropic_version" in body:
            return body
        out = {k: v for k, v in body.items() if k != "model"}
        out.setdefault("anthropic_version", version)
        return out

    body = enveloped(need.body)
    fallback = enveloped(need.fallback) if need.fallback is not None else None
    encoded = need.encoded if body is need.body else b""
    return replace(need, body=body, fallback=fallback, encoded=encoded)


def read_result_tool(name: str, deferred: bool = False) -> JSON:
    """The injected tool as a Messages tool: the same bytes every time. `deferred` (tool
    search's `defer_loading`): the API leaves a deferred tool out of the prompt's prefix
    and puts its definition where a `tool_reference` names it (`loading`), so the request
    that adds it reads the client's tools and system from the cache instead of writing
    them again, as the history before its first new stub."""
    tool = {
        "name": name,
        "description": offload.READ_RESULT_DESCRIPTION,
        "input_schema": offload.read_result_schema(),
    }
    return {**tool, "defer_loading": True} if deferred else tool


def with_read_result(
    body: Mapping[str, Any], messages: list[JSON], tool: str, tool_search: bool = False
) -> tuple[list[JSON], list[Any]]:
    """The history and tools a request goes with when read_result (`tool`) joins it.
    Deferred, loaded by the first stub, where tool search is on for the client's requests
    (`tool_search`: its betas say so, `searches_tools`; or it defers tools already), so
    the API takes `defer_loading` and `tool_reference` from them, and a stub is there to
    load it; else listed as the client's tools are (a client without tool search may
    reach an API or a platform that does not take them, and a deferred tool no reference
    loads could not be called)."""
    tools = body.get("tools")
    listed = tools if isinstance(tools, list) else []
    searching = tool_search or defers_tools(listed)
    loaded = loading(messages, tool) if searching else messages
    return loaded, [*listed, read_result_tool(tool, deferred=loaded is not messages)]


# The betas under which the API takes deferred tools and their references: Claude Code
# sends the first with ENABLE_TOOL_SEARCH set (needed behind a base URL not Anthropic's),
# from its first request, though it defers a tool in `tools` only once ToolSearch loaded
# one (until then it does not send them at all).
TOOL_SEARCH_BETAS = ("advanced-tool-use-", "tool-search-tool-")


def searches_tools(betas: str) -> bool:
    """Whether a request's `anthropic-beta` (one comma list) turns tool search on."""
    return any(b.strip().lower().startswith(TOOL_SEARCH_BETAS) for b in betas.split(","))


def loading(messages: list[JSON], tool: str) -> list[JSON]:
    """The messages with their first stub of `tool` loading it: that tool_result's
    content its text then a `tool_reference` to the tool (one a request: where the
    API puts the definition). The first stub stays the first between folds, so the
    messages before and after it are sent the same every turn. No stub: unchanged."""
    for i, message in enumerate(messages):
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        for j, block in enumerate(content):
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            text = _stub_text(block.get("content"))
            if text is not None and offload.names_tool(text, tool):
                parts = [{"type": "text", "text": text}, tool_reference(tool)]
                loaded = [*content[:j], {**block, "content": parts}, *content[j + 1 :]]
                return [*messages[:i], {**message, "content": loaded}, *messages[i + 1 :]]
    return messages


def listed_form(body: Mapping[str, Any], tool: str) -> JSON:
    """A body `with_read_result` made deferred, with read_result listed instead: its
    `defer_loading` dropped, and the reference that loaded it taken out of the first
    stub (left as one text part). The rest is the very objects of `body`."""
    tools = body.get("tools")
    listed = tools if isinstance(tools, list) else []
    out: dict[str, Any] = {**body, "tools": [
        {k: v for k, v in t.items() if k != "defer_loading"}
        if isinstance(t, dict) and t.get("name") == tool else t
        for t in listed
    ]}  # fmt: skip
    reference = tool_reference(tool)
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list) or message.get("role") != "user":
            continue
        for j, block in enumerate(content):
            inner = block.get("content") if isinstance(block, dict) else None
            if not isinstance(inner, list) or block.get("type") != "tool_result":
                continue
            if reference in inner:
                kept = [part for part in inner if part != reference]
                unloaded = [*content[:j], {**block, "content": kept}, *content[j + 1 :]]
                assert isinstance(messages, list)
                changed = {**message, "content": unloaded}
                out["messages"] = [*messages[:i], changed, *messages[i + 1 :]]
                return out
    return out


def _stub_text(content: object) -> str | None:
    """A tool_result's text in the forms `with_results` writes a stub: a string, or one
    text part."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict):
        text = content[0].get("text") if content[0].get("type") == "text" else None
        return text if isinstance(text, str) else None
    return None


def tool_reference(tool: str) -> JSON:
    return {"type": "tool_reference", "tool_name": tool}


def loading_tokens(
    counter: MessageCounter, tool: str, tools: object, tool_search: bool = False
) -> int:
    """What `loading` adds to a history's count where read_result joins deferred
    (`with_read_result`: tool search on, or the client's `tools` defer some): the
    reference, and the stub's content as a list of parts rather than a string."""
    if not tool_search and (not isinstance(tools, list) or not defers_tools(tools)):
        return 0
    plain = {"type": "tool_result", "tool_use_id": "toolu_0", "content": "x"}
    loaded = {**plain, "content": [{"type": "text", "text": "x"}, tool_reference(tool)]}
    return counter.count_block(loaded) - counter.count_block(plain)


def choose_tool_name(tools: object) -> str | None:
    """The read_result name the request's tools leave free (None: offload is off)."""
    listed = tools if isinstance(tools, list) else []
    return offload.free_tool_name({t.get("name") for t in listed if isinstance(t, dict)})


def with_results(message: Message, texts: Mapping[int, str]) -> JSON:
    """A copy of a user message with the tool_result blocks at these indices holding
    these texts (as a string, or one text part where the content was a list of parts);
    every other field of each block (is_error, cache_control, unknown ones) is kept."""
    content = list(message["content"])
    for index, text in texts.items():
        block = dict(content[index])
        original = block.get("content")
        block["content"] = text if isinstance(original, str) else [{"type": "text", "text": text}]
        content[index] = block
    return {**message, "content": content}


def render_transcript(messages: Sequence[Message]) -> str:
    """The messages as plain text for the summariser (thinking left out)."""
    parts = []
    for message in messages:
        role = str(message.get("role", "?"))
        content = message.get("content")
        lines = [content] if isinstance(content, str) else _block_lines(content)
        body = "\n".join(line for line in lines if line)
        if body:
            parts.append(f"## {role}\n{body}")
    return "\n\n".join(parts)


def _block_lines(content: object) -> list[str]:
    if not isinstance(content, list):
        return []
    lines = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            lines.append(str(block.get("text", "")))
        elif kind == "tool_use":
            arguments = orjson.dumps(block.get("input", {})).decode()
            lines.append(f"[tool call {block.get('name')} id={block.get('id')}] {arguments}")
        elif kind == "tool_result":
            error = " (error)" if block.get("is_error") else ""
            inner = block.get("content")
            text = inner if isinstance(inner, str) else "\n".join(_block_lines(inner))
            lines.append(f"[tool result id={block.get('tool_use_id')}{error}]\n{text}")
        elif kind in ("thinking", "redacted_thinking"):
            continue  # the agent's private reasoning: not facts of the conversation
        else:
            lines.append(f"[{kind}]")
    return lines


def text_message(text: str) -> JSON:
    """A user message of one text block: how the proxy's summaries and notes are written."""
    return {"role": "user", "content": [{"type": "text", "text": text}]}


class MessagesRequest:
    """What a Messages request is (`Request`)."""

    name = "anthropic"
    history_field = "messages"

    messages = staticmethod(request_messages)
    max_output = staticmethod(max_output)

    def with_history(
        self,
        body: Mapping[str, Any],
        messages: list[JSON],
        tool: str | None,
        tool_search: bool = False,
    ) -> JSON:
        if not tool:
            return {"messages": messages}
        sent, tools = with_read_result(body, messages, tool, tool_search)
        return {"messages": sent, "tools": tools}

    def deferred(self, body: Mapping[str, Any], tool: str) -> bool:
        tools = body.get("tools")
        last = tools[-1] if isinstance(tools, list) and tools else None  # (where it joins)
        return isinstance(last, dict) and last.get("name") == tool and "defer_loading" in last

    listed = staticmethod(listed_form)

    def counter(self, base: TokenCounter) -> MessageCounter:
        return base  # the shared block counter reads Messages content as it is

    def fixed_tokens(self, counter: MessageCounter, body: Mapping[str, Any]) -> int:
        system = body.get("system")
        system_tokens = counter.count_content(system) if system else 0
        # Deferred tools (tool search) count once a tool_reference loads them.
        return system_tokens + counter.count_tools(
            loaded_tools(body.get("tools"), body.get("messages"))
        )

    def tool_name(self, body: Mapping[str, Any]) -> str | None:
        return choose_tool_name(body.get("tools"))

    def identity_view(self, body: Mapping[str, Any]) -> IdentityView:
        messages = body.get("messages")
        first = messages[0] if isinstance(messages, list) and messages else None
        return IdentityView(body.get("system"), first, metadata=body.get("metadata"))

    def breakpoints(self, body: Mapping[str, Any]) -> int:
        # A key of the JSON: inside a string its quotes would be escaped.
        outside = (body.get("system"), body.get("tools"))
        return orjson.dumps(outside).count(b'"cache_control"')

    def request_error(
        self, body: Mapping[str, Any], model: str, memo: Validated | None = None
    ) -> str | None:
        if "model" not in body and model:  # Bedrock's and Vertex's name it in the path
            body = {"model": model, **body}
        return validate_messages_request(body, memo)


class MessagesDialect:
    """How the planner sees a Messages history and what it writes into one (`Dialect`)."""

    offload_batch = 1  # the proxy's breakpoint before the next result to stub: as each ages

    message_shape = staticmethod(message_shape)
    with_results = staticmethod(with_results)
    render_transcript = staticmethod(render_transcript)
    read_result_tool = staticmethod(read_result_tool)
    loading_tokens = staticmethod(loading_tokens)

    def head_text(self, message: Message) -> str:
        return head_text(message, render_transcript)

    def tool_results(self, message: Message) -> list[ToolResult]:
        """tool_result blocks of a user message, by block index."""
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            return []
        results = []
        for b, block in enumerate(content):
            if isinstance(block, dict) and block.get("type") == "tool_result":
                inner = block.get("content")
                text = offload.content_text(inner)
                results.append(ToolResult(b, block.get("tool_use_id"), inner, text))
        return results

    def gives_results(self, message: Message) -> bool:
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            return False
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                return True
        return False

    def summary_message(self, text: str, folded: int) -> JSON:
        return text_message(summary.summary_text(text, folded))

    def note_message(self, text: str) -> JSON:
        return text_message(text)

    def with_breakpoint(
        self, messages: Sequence[JSON], at: int, uncached_tail: bool
    ) -> list[JSON] | None:
        message = messages[at]
        content = message.get("content")
        if not isinstance(content, list) or not content or not isinstance(content[-1], dict):
            return None
        if any(isinstance(b, dict) and "cache_control" in b for b in content):
            return None  # the client's own breakpoint: never moved
        last = {**content[-1], "cache_control": {"type": "ephemeral"}}
        tail = list(messages[at + 1 :])
        if uncached_tail:  # the newest result, stubbed by the next request (issue 35)
            tail = [_unmarked(m) for m in tail]
        return [*messages[:at], {**message, "content": [*content[:-1], last]}, *tail]


def _unmarked(message: Message) -> JSON:
    """The message without the client's prompt-cache breakpoints."""
    content = message.get("content")
    if not isinstance(content, list):
        return dict(message)
    blocks = [
        {k: v for k, v in b.items() if k != "cache_control"} if isinstance(b, dict) else b
        for b in content
    ]
    return {**message, "content": blocks}


class MessagesSummaries:
    """The summariser's call on the Messages API (`Summaries`)."""

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
                "max_tokens": summary_tokens,
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
        # a thinking budget comes on top of the notes' summary_tokens.
        thinking = body.get("thinking")
        budget = None
        if isinstance(thinking, dict) and thinking.get("type") == "enabled":
            budget = thinking.get("budget_tokens")
        extra = budget if isinstance(budget, int) else 0
        out["max_tokens"] = summary_tokens + extra
        # Never above the model's max output (the API would refuse it), while the thinking
        # budget still leaves room for notes.
        limit = model_facts.max_output(model)
        if limit and summary_tokens + extra > limit > extra:
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


class MessagesUsage:
    """Usage in Messages answers, whole or streamed (`UsageReader`)."""

    lines = lines_starting(_START, _DELTA, _TEXT)

    usage = staticmethod(anthropic_usage)

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


class MessagesErrors:
    """The Messages API's errors (`ErrorShapes`)."""

    request_id_header = "request-id"

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


class AnthropicMessages(
    MessagesRequest,
    MessagesDialect,
    MessagesSummaries,
    MessagesRounds,
    MessagesUsage,
    MessagesErrors,
):
    """POST /v1/messages (and count_tokens): Anthropic's Messages API, made of its parts."""


ANTHROPIC = AnthropicMessages()
