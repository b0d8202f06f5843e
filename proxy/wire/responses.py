"""OpenAI's Responses API (`POST /v1/responses`) as a `WireFormat` (proxy/core/wire_format.py),
made of its parts: `ResponsesRequest`, `ResponsesDialect`, `ResponsesSummaries`,
`ResponsesUsage`, `ResponsesErrors` here, and `ResponsesRounds` (read_result rounds) in
proxy/wire/responses_rounds.py.

The planner's messages are *units* of input items (proxy/wire/responses_units.py): a
call, the reasoning before it and its output are kept or dropped together; the items a
conversation starts with, developer and system messages and `compaction` items are
pinned. Rewriting a request replaces `input` with the units' items, in order (and
appends read_result to `tools`); every other field passes through.

- Offload: a `function_call_output` or `custom_tool_call_output` (a string or parts)
  becomes a stub; read_result is a flat `function` tool (`strict: false`: its start and
  length are optional), named apart from every tool the request can call.
- Summaries and drop notes are user messages with one `input_text` part.
- A request that asks for a summary itself (Codex's `compaction_trigger`, or a request
  with `tools: []` such as Codex's handoff-summary request) gets no read_result; so does
  one that continues stored state (`previous_response_id`, `conversation`), whose history
  the proxy cannot see.
- Usage: `input_tokens` counts every input token, `input_tokens_details.cached_tokens`
  the cached ones.
- The proxy's own errors: OpenAI's JSON shape; inside a stream, an `error` event then
  `response.failed` (the openai SDK raises on the first, Codex reads the second).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.core import offload, summary
from proxy.core.errors import ProxyError
from proxy.core.policy import PREFIX_CACHED_BATCH
from proxy.core.tokens import MESSAGE_OVERHEAD, TOOL_FRAMING, TokenCounter
from proxy.core.usage import DATA_LINES, LineKind, Usage
from proxy.core.validated import Validated
from proxy.core.wire_format import JSON, IdentityView, MessageCounter
from proxy.wire.common import (
    FormatCounter,
    head_text,
    listed_already,
    never_deferred,
    openai_error,
)
from proxy.wire.responses_rounds import ResponsesRounds, responses_usage
from proxy.wire.responses_units import (
    ANSWER_TYPES,
    CALL_ANSWERS,
    PINNED_ROLES,
    flatten,
    gives_results,
    input_items,
    item_type,
    part_texts,
    render_transcript,
    text_message,
    tool_names,
    tool_results,
    unit_items,
    unit_shape,
    unit_with_results,
    units_of,
    user_text_unit,
)
from proxy.wire.responses_validation import validate_responses_request

Message = Mapping[str, Any]
OPAQUE_CHARS_PER_TOKEN = 4  # sealed content (reasoning, compaction): a guess on the high side


def asks_for_summary(body: Mapping[str, Any]) -> bool:
    """A request whose answer is a summary of the history: Codex's compaction_trigger,
    or a request offering no tools (Codex's handoff-summary request)."""
    if body.get("tools") == []:
        return True
    items = input_items(body)
    return bool(items) and item_type(items[-1]) == "compaction_trigger"


def read_result_tool(name: str) -> dict[str, Any]:
    """The injected tool as a Responses function tool: the same bytes every time."""
    return {
        "type": "function",
        "name": name,
        "description": offload.READ_RESULT_DESCRIPTION,
        "parameters": offload.read_result_schema(),
        "strict": False,
    }


def identity_view(body: Mapping[str, Any]) -> IdentityView:
    """What identifies a Responses conversation: the thread id Codex puts in
    `prompt_cache_key` when there is one; else the instructions with the leading developer
    and system messages, and the first other item."""
    items = input_items(body)
    lead = 0
    while lead < len(items) and item_type(items[lead]) == "message":
        if items[lead].get("role") not in PINNED_ROLES:
            break
        lead += 1
    first = items[lead] if lead < len(items) else None
    key = body.get("prompt_cache_key")
    hint = key if isinstance(key, str) else ""
    return IdentityView([body.get("instructions"), *items[:lead]], first, hint)


# -- counting -----------------------------------------------------------------------------


class ResponsesCounter(FormatCounter):
    """Token estimates for units of Responses items, on top of the shared block counter
    (and its cache). Sealed content (reasoning, compaction) cannot be read: it is
    charged by its length, on the high side; calibration corrects the whole."""

    def count_message(self, message: Mapping[str, Any]) -> int:
        return sum(self.count_item(item) for item in unit_items(message))

    def _parts(self, content: object) -> int:
        if isinstance(content, str):
            return self.base.count_text(content)
        total = 0
        for part in content if isinstance(content, list) else ():
            text = part.get("text") if isinstance(part, dict) else None
            total += (
                self.base.count_text(text) if isinstance(text, str) else self.base.count_json(part)
            )
        return total

    def _opaque(self, value: object) -> int:
        return -(-len(value) // OPAQUE_CHARS_PER_TOKEN) if isinstance(value, str) else 0

    def count_item(self, item: Any) -> int:
        if not isinstance(item, dict):
            return MESSAGE_OVERHEAD + self.base.count_json(item)
        kind = item_type(item)
        if kind == "message":
            return MESSAGE_OVERHEAD + self._parts(item.get("content"))
        if kind in CALL_ANSWERS:
            name = item.get("name")
            payload = item.get("arguments", item.get("input", item.get("action")))
            return (
                MESSAGE_OVERHEAD
                + TOOL_FRAMING
                + (self.base.count_text(name) if isinstance(name, str) else 0)
                + (
                    self.base.count_text(payload)
                    if isinstance(payload, str)
                    else self.base.count_json(payload)
                )
            )
        if kind in ANSWER_TYPES:
            output = item.get("output")
            if output is None:
                return MESSAGE_OVERHEAD + TOOL_FRAMING + self.base.count_json(item)
            return MESSAGE_OVERHEAD + TOOL_FRAMING + self._parts(output)
        if kind in ("reasoning", "compaction"):
            return (
                MESSAGE_OVERHEAD
                + self._parts(item.get("summary"))
                + self._parts(item.get("content"))
                + self._opaque(item.get("encrypted_content"))
            )
        if kind == "compaction_trigger":
            return 0
        return MESSAGE_OVERHEAD + self.base.count_json(item)

    def count_request(self, body: Mapping[str, Any]) -> int:
        instructions = body.get("instructions")
        return (
            self.count_tools(body.get("tools"))
            + (self.base.count_text(instructions) if isinstance(instructions, str) else 0)
            + sum(self.count_item(item) for item in input_items(body))
        )


# -- errors -------------------------------------------------------------------------------


def error_events(error: Mapping[str, Any], response_id: str = "resp_compaction_proxy") -> bytes:
    """An error inside a stream that started: an `error` event (flat, with the nested
    `error` object too), then `response.failed` ending the response."""
    flat = {k: error.get(k) for k in ("code", "message", "param")}
    data = {"type": "error", "sequence_number": 0, **flat, "error": dict(error)}
    failed = {
        "type": "response.failed",
        "sequence_number": 1,
        "response": {
            "id": response_id,
            "object": "response",
            "status": "failed",
            "error": {"code": error.get("code"), "message": error.get("message")},
            "output": [],
            "usage": None,
        },
    }
    return (
        b"event: error\ndata: "
        + orjson.dumps(data)
        + b"\n\nevent: response.failed\ndata: "
        + orjson.dumps(failed)
        + b"\n\n"
    )


_END_TYPES = (b'"response.completed"', b'"response.incomplete"', b'"response.failed"')
_TEXT_DELTA = b'"response.output_text.delta"'


class ResponsesRequest:
    """What a Responses request is (`Request`): its history is units of input items."""

    name = "responses"
    history_field = "input"

    identity_view = staticmethod(identity_view)

    def messages(self, body: Mapping[str, Any]) -> list[JSON]:
        return units_of(input_items(body))

    deferred = staticmethod(never_deferred)
    listed = staticmethod(listed_already)

    def with_history(
        self,
        body: Mapping[str, Any],
        messages: list[JSON],
        tool: str | None,
        tool_search: bool = False,  # (Messages only: the tool is listed here)
    ) -> JSON:
        fields: JSON = {"input": flatten(messages)}
        if tool:  # (None for a request asking for a summary: routes.py Incoming)
            tools = body.get("tools")
            listed = tools if isinstance(tools, list) else []
            fields["tools"] = [*listed, read_result_tool(tool)]
        return fields

    def counter(self, base: TokenCounter) -> MessageCounter:
        return ResponsesCounter(base)

    def fixed_tokens(self, counter: MessageCounter, body: Mapping[str, Any]) -> int:
        instructions = body.get("instructions")
        text = counter.count_text(instructions) if isinstance(instructions, str) else 0
        return counter.count_tools(body.get("tools")) + text

    def tool_name(self, body: Mapping[str, Any]) -> str | None:
        if body.get("previous_response_id") or body.get("conversation"):
            return None  # the history lives upstream: the rounds could not continue it
        return offload.free_tool_name(tool_names(body))

    def max_output(self, body: Mapping[str, Any]) -> int | None:
        value = body.get("max_output_tokens")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        return None

    def breakpoints(self, body: Mapping[str, Any]) -> int:
        return 0  # OpenAI caches prompt prefixes without breakpoints

    def request_error(
        self, body: Mapping[str, Any], model: str, memo: Validated | None = None
    ) -> str | None:
        if body.get("previous_response_id") or body.get("conversation"):
            return None  # what it continues lives upstream: its pairing is not ours to judge
        # `compaction` items read as OpenAI reads them: only OpenAI's server makes them.
        invalid = validate_responses_request(body, openai=True)
        return invalid.message if invalid is not None else None


class ResponsesDialect:
    """How the planner sees units of Responses items and what it writes (`Dialect`)."""

    offload_batch = PREFIX_CACHED_BATCH  # OpenAI caches prompt prefixes by itself

    message_shape = staticmethod(unit_shape)
    tool_results = staticmethod(tool_results)
    gives_results = staticmethod(gives_results)
    with_results = staticmethod(unit_with_results)
    render_transcript = staticmethod(render_transcript)
    read_result_tool = staticmethod(read_result_tool)

    def loading_tokens(
        self, counter: MessageCounter, name: str, tools: object, tool_search: bool = False
    ) -> int:
        return 0  # the tool is listed, not deferred

    note_message = staticmethod(user_text_unit)

    def head_text(self, message: Message) -> str:
        return head_text(message, render_transcript)

    def summary_message(self, text: str, folded: int) -> JSON:
        return user_text_unit(summary.summary_text(text, folded))

    def with_breakpoint(
        self, messages: Sequence[JSON], at: int, uncached_tail: bool
    ) -> list[JSON] | None:
        return None  # OpenAI caches prompt prefixes without breakpoints


class ResponsesSummaries:
    """The summariser's call on the Responses API (`Summaries`)."""

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
                "max_output_tokens": summary_tokens,
                "instructions": summary.INSTRUCTION,
                "input": [text_message("user", prompt)],
                "store": False,
            }
        choice = body.get("tool_choice")
        if choice == "required" or isinstance(choice, dict):
            return None  # the model would have to call a tool, not write notes
        if body.get("previous_response_id") or body.get("conversation"):
            return None  # the history lives upstream
        out = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        out["input"] = [*flatten(history), text_message("user", prompt)]
        out["max_output_tokens"] = summary_tokens
        return out

    def answer_text(self, answer: JSON) -> str:
        return "".join(
            "".join(part_texts(item.get("content")))
            for item in answer.get("output") or ()
            if isinstance(item, dict) and item_type(item) == "message"
        )


class ResponsesUsage:
    """Usage in Responses answers, whole or streamed (`UsageReader`)."""

    lines = DATA_LINES

    usage = staticmethod(responses_usage)

    def line_may_matter(self, head: bytes) -> bool:
        return head.startswith(b"data: {") and any(end in head for end in _END_TYPES)

    def usage_line(self, line: bytes) -> tuple[LineKind, Usage] | None:
        try:
            data = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            return None
        response = data.get("response") if isinstance(data, dict) else None
        usage = response.get("usage") if isinstance(response, dict) else None
        if not isinstance(usage, dict):
            return None
        return LineKind.END, responses_usage(usage)

    def text_chars(self, line: bytes) -> int:
        if _TEXT_DELTA not in line[:64]:
            return 0
        try:
            data = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            return 0
        delta = data.get("delta") if isinstance(data, dict) else None
        return len(delta) if isinstance(delta, str) else 0

    def body_usage(self, body: Mapping[str, Any]) -> Usage | None:
        usage = body.get("usage")
        return responses_usage(usage) if isinstance(usage, dict) else None


class ResponsesErrors:
    """The Responses API's errors (`ErrorShapes`)."""

    request_id_header = "x-request-id"

    def error_body(self, error: ProxyError, request_id: str) -> bytes:
        return orjson.dumps({"error": openai_error(error)})

    def stream_error(self, error: ProxyError) -> bytes:
        return error_events(openai_error(error))

    def upstream_stream_error(self, payload: object, status: int) -> bytes:
        error = payload.get("error") if isinstance(payload, dict) else None
        if not isinstance(error, dict):
            error = {"message": f"upstream answered {status}", "type": "server_error"}
        return error_events(error)


class ResponsesAPI(
    ResponsesRequest,
    ResponsesDialect,
    ResponsesSummaries,
    ResponsesRounds,
    ResponsesUsage,
    ResponsesErrors,
):
    """POST /v1/responses: OpenAI's Responses API, made of its parts."""


RESPONSES = ResponsesAPI()

__all__ = ["RESPONSES", "ResponsesAPI", "asks_for_summary", "part_texts", "responses_usage"]
