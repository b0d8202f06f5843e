"""Google's Gemini API (`models/{model}:generateContent` and `:streamGenerateContent`) as
a `WireFormat` (proxy/core/wire_format.py), made of its parts: `GeminiRequest`,
`GeminiDialect`, `GeminiSummaries`, `GeminiUsage`, `GeminiErrors` here, and
`GeminiRounds` (read_result rounds) in proxy/wire/gemini_rounds.py; contents and parts
are read in proxy/wire/gemini_parts.py.

The planner's messages are the request's `contents`, as they are (never copied or
normalised: unknown fields, parts and signatures pass through byte for byte):

- a `model` content is the assistant's turn; its functionCall parts are calls, and the
  next `user` content's functionResponse parts answer them, one each, by position (the
  API's own rule), so the two are one group;
- `systemInstruction` and `tools` are fixed (outside the history); `cachedContent`, a
  prefix stored at Google, is left alone, and since the API refuses tools beside it,
  such a request gets no read_result;
- offload: a functionResponse's `response` becomes a stub (kept under its one string
  field, as `{"output": ...}` otherwise); read_result is a function declaration added to
  the request's first `functionDeclarations` (a tool of its own when there is none);
  requests that ask for JSON (`responseMimeType`, a schema) get none, as the API
  refuses function calling beside a JSON response;
- summaries and drop notes are `user` contents of one text part;
- usage: `promptTokenCount` counts every input token, `cachedContentTokenCount` the
  cached ones; `candidatesTokenCount` and `thoughtsTokenCount` the output;
- the proxy's own errors: `{"error": {"code", "message", "status"}}`, inside a stream a
  `data:` line of the same.
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
from proxy.core.tokens import TokenCounter
from proxy.core.usage import DATA_LINES, LineKind, Usage
from proxy.core.validated import Validated
from proxy.core.wire_format import JSON, IdentityView, MessageCounter
from proxy.wire.common import listed_already, never_deferred
from proxy.wire.gemini_parts import (
    GeminiCounter,
    call_key,
    field,
    function_calls,
    function_responses,
    has_field,
    head_text,
    parts_of,
    render_transcript,
    response_text,
    role_of,
    snake,
    with_response_text,
)
from proxy.wire.gemini_rounds import GeminiRounds, gemini_usage
from proxy.wire.gemini_validation import check_request

Message = Mapping[str, Any]

# The role a Shape gives a model turn: the neutral history pairs an "assistant" message's
# calls with the answers after it.
ASSISTANT = "assistant"

# google.rpc codes by HTTP status, as Google's APIs spell them in `error.status`.
STATUS_CODES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    415: "INVALID_ARGUMENT",
    417: "FAILED_PRECONDITION",
    426: "FAILED_PRECONDITION",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def status_name(status: int) -> str:
    if status in STATUS_CODES:
        return STATUS_CODES[status]
    return "INVALID_ARGUMENT" if 400 <= status < 500 else "INTERNAL"


def error_payload(status: int, message: str, *, retry_after: int | None = None) -> JSON:
    """An error in Google's shape; a wait, as the RetryInfo detail clients read it from."""
    error: JSON = {"code": status, "message": message, "status": status_name(status)}
    if retry_after is not None:
        error["details"] = [
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{retry_after}s"}
        ]
    return {"error": error}


def stream_error_event(payload: Mapping[str, Any]) -> bytes:
    """An error inside a stream that already started: a `data:` line of the error object
    (the google-genai SDKs raise on a chunk that is one)."""
    return b"data: " + orjson.dumps(payload) + b"\r\n\r\n"


# -- shapes and the history ----------------------------------------------------------------


def message_shape(message: Message, tokens: int) -> Shape:
    """A model turn's calls and a user turn's answers, named by position (gemini_parts)."""
    role = role_of(message)
    if role == "model":
        calls = tuple(call_key(k) for k in range(len(function_calls(message))))
        return Shape(ASSISTANT, tokens, calls=calls)
    answers = tuple(call_key(k) for k in range(len(function_responses(message))))
    return Shape(role, tokens, answers=answers)


def contents_of(body: Mapping[str, Any]) -> list[JSON]:
    contents = body.get("contents")
    if not isinstance(contents, list):
        return []
    return [c for c in contents if isinstance(c, dict)]


def text_content(text: str) -> JSON:
    """A user turn of one text part: how the proxy writes summaries and notes."""
    return {"role": "user", "parts": [{"text": text}]}


def read_result_tool(name: str) -> JSON:
    """The injected function declaration: the same bytes every time (JSON Schema, so
    `parametersJsonSchema`)."""
    return {
        "name": name,
        "description": offload.READ_RESULT_DESCRIPTION,
        "parametersJsonSchema": offload.read_result_schema(),
    }


def declared_names(tools: object) -> set[str]:
    """Names of every function the request declares."""
    names: set[str] = set()
    for tool in tools if isinstance(tools, list) else ():
        declarations = field(tool, "functionDeclarations") if isinstance(tool, dict) else None
        for declaration in declarations if isinstance(declarations, list) else ():
            if isinstance(declaration, dict) and isinstance(declaration.get("name"), str):
                names.add(declaration["name"])
    return names


def with_read_result(tools: object, name: str) -> list[Any]:
    """The request's tools with read_result declared: added to the first tool that
    declares functions (one list of declarations, as clients send them), else as a tool
    of its own after the others (the built-in ones)."""
    listed = list(tools) if isinstance(tools, list) else []
    declaration = read_result_tool(name)
    for i, tool in enumerate(listed):
        if not isinstance(tool, dict):
            continue
        key = "functionDeclarations" if "functionDeclarations" in tool else "function_declarations"
        declarations = tool.get(key)
        if isinstance(declarations, list):
            listed[i] = {**tool, key: [*declarations, declaration]}
            return listed
    return [*listed, {"functionDeclarations": [declaration]}]


def asks_for_json(body: Mapping[str, Any]) -> bool:
    """A request for a JSON answer (the API refuses function calling beside one)."""
    config = field(body, "generationConfig")
    if not isinstance(config, dict):
        return False
    mime = field(config, "responseMimeType")
    if isinstance(mime, str) and mime.lower().startswith("application/json"):
        return True
    return any(has_field(config, k) for k in ("responseSchema", "responseJsonSchema"))


def candidate_count(body: Mapping[str, Any]) -> int:
    config = field(body, "generationConfig")
    count = field(config, "candidateCount") if isinstance(config, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) else 1


def max_output(body: Mapping[str, Any]) -> int | None:
    config = field(body, "generationConfig")
    value = field(config, "maxOutputTokens") if isinstance(config, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def identity_view(body: Mapping[str, Any]) -> IdentityView:
    """The system instruction, then the first content (the instruction alone is shared by
    every session of an agent)."""
    contents = contents_of(body)
    return IdentityView(field(body, "systemInstruction"), contents[0] if contents else None)


class GeminiRequest:
    """What a generateContent request is (`Request`)."""

    name = "gemini"
    history_field = "contents"  # (the reuse cache finds the repeated history there)

    messages = staticmethod(contents_of)
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
        fields: JSON = {"contents": messages}
        if tool:
            fields["tools"] = with_read_result(body.get("tools"), tool)
        return fields

    def counter(self, base: TokenCounter) -> MessageCounter:
        return GeminiCounter(base)

    def fixed_tokens(self, counter: MessageCounter, body: Mapping[str, Any]) -> int:
        system = field(body, "systemInstruction")
        return counter.count_content(system) + counter.count_tools(body.get("tools"))

    def tool_name(self, body: Mapping[str, Any]) -> str | None:
        if has_field(body, "cachedContent") or asks_for_json(body) or candidate_count(body) != 1:
            return None  # tools cannot go beside a cached prefix or a JSON answer
        return offload.free_tool_name(declared_names(body.get("tools")))

    def breakpoints(self, body: Mapping[str, Any]) -> int:
        return 0  # Gemini caches repeated prefixes by itself (implicit caching)

    def request_error(
        self, body: Mapping[str, Any], model: str, memo: Validated | None = None
    ) -> str | None:
        violation = check_request(body, model or str(body.get("model", "")))
        return violation.message if violation is not None else None


class GeminiDialect:
    """How the planner sees Gemini contents and what it writes into them (`Dialect`)."""

    offload_batch = PREFIX_CACHED_BATCH  # the API caches repeated prefixes by itself

    message_shape = staticmethod(message_shape)
    render_transcript = staticmethod(render_transcript)
    read_result_tool = staticmethod(read_result_tool)

    def loading_tokens(
        self, counter: MessageCounter, name: str, tools: object, tool_search: bool = False
    ) -> int:
        return 0  # the tool is listed, not deferred

    head_text = staticmethod(head_text)

    def tool_results(self, message: Message) -> list[ToolResult]:
        """A user turn's function responses, by part index."""
        if role_of(message) == "model":
            return []
        return [
            ToolResult(i, str(response.get("id") or response.get("name") or ""), text, text)
            for i, response in function_responses(message)
            if (text := response_text(response)) is not None
        ]

    def gives_results(self, message: Message) -> bool:
        return bool(self.tool_results(message))  # (a response's text decides: see there)

    def with_results(self, message: Message, texts: Mapping[int, str]) -> JSON:
        parts = list(message.get("parts") or [])
        for index, text in texts.items():
            part = parts[index]
            key = "functionResponse" if "functionResponse" in part else "function_response"
            parts[index] = {**part, key: with_response_text(part[key], text)}
        return {**message, "parts": parts}

    def summary_message(self, text: str, folded: int) -> JSON:
        return text_content(summary.summary_text(text, folded))

    def note_message(self, text: str) -> JSON:
        return text_content(text)

    def with_breakpoint(
        self, messages: Sequence[JSON], at: int, uncached_tail: bool
    ) -> list[JSON] | None:
        return None  # no breakpoints: the API caches repeated prefixes by itself


# The thinking a summary call asks for: the notes matter, not deep reasoning (Gemini 3
# takes a level, 2.5 a budget; neither changes the prefix the cache reads).
SUMMARY_THINKING_LEVEL = "low"


def _summary_config(config: object, summary_tokens: int) -> JSON:
    """The conversation's generation config for a summary: its output cap, less thinking,
    no thoughts shown, and no JSON (the notes are text)."""
    out = dict(config) if isinstance(config, dict) else {}
    for name in ("responseMimeType", "responseSchema", "responseJsonSchema", "candidateCount"):
        out.pop(name, None)
        out.pop(snake(name), None)
    thinking = field(out, "thinkingConfig")
    budget = 0
    if isinstance(thinking, dict):
        thinking = {
            k: v for k, v in thinking.items() if k not in ("includeThoughts", "include_thoughts")
        }
        if has_field(thinking, "thinkingLevel"):
            thinking.pop("thinking_level", None)
            thinking["thinkingLevel"] = SUMMARY_THINKING_LEVEL
        value = field(thinking, "thinkingBudget")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            budget = value  # the thinking comes out of the same output cap
        out.pop("thinking_config", None)
        out["thinkingConfig"] = thinking
    out.pop("max_output_tokens", None)
    out["maxOutputTokens"] = summary_tokens + budget
    return out


class GeminiSummaries:
    """The summariser's call on the Gemini API (`Summaries`). The model is named by the
    URL, not the body: the caller posts it to that model's generateContent."""

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
                "contents": [text_content(prompt)],
                "systemInstruction": {"parts": [{"text": summary.INSTRUCTION}]},
                "generationConfig": {"maxOutputTokens": summary_tokens},
            }
        config = field(body, "toolConfig")
        calling = field(config, "functionCallingConfig") if isinstance(config, dict) else None
        mode = field(calling, "mode") if isinstance(calling, dict) else None
        if isinstance(mode, str) and mode.upper() in ("ANY", "VALIDATED"):
            return None  # the model would have to call a function, not write notes
        out = {k: v for k, v in body.items() if k not in ("generationConfig", "generation_config")}
        out["contents"] = [*history, text_content(prompt)]
        out["generationConfig"] = _summary_config(field(body, "generationConfig"), summary_tokens)
        return out

    def answer_text(self, answer: JSON) -> str:
        candidates = answer.get("candidates")
        first = candidates[0] if isinstance(candidates, list) and candidates else None
        content = first.get("content") if isinstance(first, dict) else None
        if not isinstance(content, dict):
            return ""
        return "".join(
            str(field(p, "text") or "") for p in parts_of(content) if p.get("thought") is not True
        )


_USAGE = b'"usageMetadata"'
_FINISH = b'"finishReason"'
_TEXT = b'"text"'
_DATA = b"data: {"
_CHUNK_OVERHEAD = 160  # bytes of JSON around a streamed text part's text


class GeminiUsage:
    """Usage in Gemini answers, whole or streamed (`UsageReader`). Every streamed chunk
    may carry usageMetadata; only the last one's (beside the finishReason) is final."""

    lines = DATA_LINES

    usage = staticmethod(gemini_usage)

    def line_may_matter(self, head: bytes) -> bool:
        return head.startswith(_DATA)

    def usage_line(self, line: bytes) -> tuple[LineKind, Usage] | None:
        if _FINISH not in line or _USAGE not in line:
            return None
        try:
            data = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            return None
        usage = data.get("usageMetadata") if isinstance(data, dict) else None
        if not isinstance(usage, dict):
            return None
        return LineKind.END, gemini_usage(usage)

    def text_chars(self, line: bytes) -> int:
        if not line.startswith(_DATA) or _TEXT not in line:
            return 0
        return max(0, len(line) - _CHUNK_OVERHEAD)

    def body_usage(self, body: Mapping[str, Any]) -> Usage | None:
        usage = body.get("usageMetadata")
        return gemini_usage(usage) if isinstance(usage, dict) else None


class GeminiErrors:
    """The Gemini API's errors (`ErrorShapes`)."""

    request_id_header = "x-request-id"

    def error_body(self, error: ProxyError, request_id: str) -> bytes:
        return orjson.dumps(
            error_payload(error.status, error.message, retry_after=error.retry_after)
        )

    def stream_error(self, error: ProxyError) -> bytes:
        return stream_error_event(error_payload(error.status, error.message))

    def upstream_stream_error(self, payload: object, status: int) -> bytes:
        if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
            return stream_error_event(payload)
        if isinstance(payload, list) and payload and isinstance(payload[0], dict):
            return stream_error_event(payload[0])  # the JSON array form's error
        return stream_error_event(error_payload(status, f"upstream answered {status}"))


class GeminiAPI(
    GeminiRequest, GeminiDialect, GeminiSummaries, GeminiRounds, GeminiUsage, GeminiErrors
):
    """models/{model}:generateContent and :streamGenerateContent: Google's Gemini API,
    made of its parts."""


GEMINI = GeminiAPI()
