"""Conversations of the kind agents send, drawn by Hypothesis, in each format the proxy
speaks; and the ways a request is broken (issue 36's battery).

A conversation is drawn once, neutrally (`Conversation`: turns of user text, tool calls
with their results, thinking, images, system text), then written in a format's own
shape by its `Format` (`MESSAGES`, `CHAT`, `RESPONSES`, `BEDROCK`, `VERTEX`, `GEMINI`):
a renderer, its path, headers and mutations.

Sizes are chosen around the battery's policy (window 20k, offload from 1.5k, fold at
6k down to 4k): results of a few to ~2,400 tokens, up to nine turns.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from hypothesis import strategies as st

from proxy.testing.google_oauth import PROJECT

JSON = dict[str, Any]

# A 1x1 PNG: images are counted by their dimensions, read from the header.
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082"
    )
).decode()
# A build id beyond 64 bits (orjson reads it as a float, and writes none): drawn as this
# placeholder, written into the bytes by `encode`.
BIG_INT = b"123456789012345678901234567890"
BIG_PLACEHOLDER = "__battery_big_int__"


def words(n: int, seed: str) -> str:
    return " ".join(f"{seed}{i % 89}" for i in range(n))


@dataclass(frozen=True)
class Call:
    id: str
    input: JSON
    result: str
    is_error: bool = False
    image: bool = False  # the result carries an image beside its text
    cached: bool = False  # a cache breakpoint on the result (Messages)


@dataclass(frozen=True)
class Turn:
    user: str
    calls: tuple[Call, ...] = ()  # parallel calls, each answered
    reply: str = ""  # the assistant's text (before its calls)
    thinking: bool = False
    system_after: str = ""  # a mid-conversation system message after the turn
    server_tool: bool = False  # a server tool's blocks in the assistant turn (Messages)
    extra_field: bool = False  # an unknown field on the user message's block
    document: bool = False  # a plain-text document beside the user's text (Messages)
    redacted: bool = False  # a redacted_thinking block in the assistant turn (Messages)


@dataclass(frozen=True)
class Conversation:
    marker: str  # keeps each example a conversation of its own
    system: str
    cached_system: bool
    turns: tuple[Turn, ...]
    question: str
    extra: JSON = field(default_factory=dict)
    # How the client writes its JSON (`encode`): compact as orjson does, every non-ASCII
    # character escaped (Python's json.dumps), or indented.
    style: str = "compact"
    cached_question: bool = False  # Claude Code's breakpoint on the newest block (Messages)


SIZES = st.sampled_from([3, 20, 120, 450, 800, 1_200])


@st.composite
def calls(draw: st.DrawFn, turn: int) -> tuple[Call, ...]:
    n = draw(st.integers(0, 3))
    made = []
    for k in range(n):
        size = draw(SIZES)
        tool_input: JSON = {"command": f"step {turn}.{k}"}
        if draw(st.booleans()):
            tool_input["build_id"] = BIG_PLACEHOLDER
        if draw(st.integers(0, 9)) == 0:
            tool_input["float"] = 1.50
        result = words(size, f"r{turn}x{k}y")
        odd = draw(st.integers(0, 9))
        if odd == 0:
            result = ""  # an empty result (a command that printed nothing)
        elif odd == 1:
            result = words(size, f"é{turn}\U0001f600{k}\u2028")  # non-ASCII, beyond the BMP
        made.append(
            Call(
                id=f"call_{turn}_{k}",
                input=tool_input,
                result=result,
                is_error=draw(st.integers(0, 4)) == 0,
                image=draw(st.integers(0, 5)) == 0,
                cached=draw(st.integers(0, 7)) == 0,
            )
        )
    return tuple(made)


@st.composite
def conversations(draw: st.DrawFn) -> Conversation:
    turns = []
    for t in range(draw(st.integers(1, 9))):
        turns.append(
            Turn(
                user=words(draw(st.sampled_from([2, 30, 300])), f"u{t}w"),
                calls=draw(calls(t)),
                reply=draw(st.sampled_from(["", "Looking.", words(150, f"a{t}w")])),
                thinking=draw(st.integers(0, 3)) == 0,
                system_after=draw(st.sampled_from(["", "", "", "Reminder: be brief."])),
                server_tool=draw(st.integers(0, 5)) == 0,
                extra_field=draw(st.integers(0, 5)) == 0,
                document=draw(st.integers(0, 7)) == 0,
                redacted=draw(st.integers(0, 7)) == 0,
            )
        )
    return Conversation(
        marker=uuid.uuid4().hex,
        system=draw(st.sampled_from(["", "You are a coding agent.", words(200, "sys")])),
        cached_system=draw(st.booleans()),
        turns=tuple(turns),
        question=draw(st.sampled_from(["What now?", words(400, "q")])),
        style=draw(st.sampled_from(["compact", "compact", "ascii", "indented"])),
        cached_question=draw(st.booleans()),
    )


# -- Messages -----------------------------------------------------------------------------


def messages_body(c: Conversation) -> JSON:
    messages: list[JSON] = []
    for n, turn in enumerate(c.turns):
        text = turn.user if n else f"[{c.marker}] {turn.user}"
        block: JSON = {"type": "text", "text": text}
        if turn.extra_field:
            block["citations_hint"] = {"kind": "unknown to the proxy"}
        said = [block]
        if turn.document:
            source = {"type": "text", "media_type": "text/plain", "data": words(60, f"d{n}w")}
            said.append({"type": "document", "source": source, "title": f"notes {n}.txt"})
        if messages and messages[-1]["role"] == "user":
            messages[-1]["content"].extend(said)  # after the results
        else:
            messages.append({"role": "user", "content": said})
        content: list[JSON] = []
        if turn.thinking:
            content.append({"type": "thinking", "thinking": "Let me see.", "signature": "sig"})
        if turn.redacted:
            content.append({"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"})
        if turn.reply:
            content.append({"type": "text", "text": turn.reply})
        if turn.server_tool:
            use = {"type": "server_tool_use", "id": f"srvtoolu_{n}", "name": "web_search"}
            found = {"type": "web_search_tool_result", "tool_use_id": f"srvtoolu_{n}"}
            content += [{**use, "input": {"query": "docs"}}, {**found, "content": []}]
        for call in turn.calls:
            content.append({"type": "tool_use", "id": call.id, "name": "run", "input": call.input})
        if not content:
            content.append({"type": "text", "text": "Done."})
        messages.append({"role": "assistant", "content": content})
        if turn.calls:
            results = []
            for call in turn.calls:
                result: JSON = {"type": "tool_result", "tool_use_id": call.id}
                if call.image:
                    said = [{"type": "text", "text": call.result}] if call.result else []
                    result["content"] = [
                        *said,
                        {"type": "image",
                         "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                    ]  # fmt: skip
                else:
                    result["content"] = call.result
                if call.is_error:
                    result["is_error"] = True
                if call.cached:
                    result["cache_control"] = {"type": "ephemeral"}
                results.append(result)
            messages.append({"role": "user", "content": results})
        if turn.system_after:
            messages.append({"role": "system", "content": turn.system_after})
    question: JSON = {"type": "text", "text": c.question}
    if c.cached_question:
        question["cache_control"] = {"type": "ephemeral"}
    if messages and messages[-1]["role"] == "user":
        messages[-1]["content"].append(question)
    else:
        messages.append({"role": "user", "content": [question]})
    body: JSON = {"model": "claude-sonnet-4-5", "max_tokens": 300}
    if c.system:
        block = {"type": "text", "text": c.system}
        if c.cached_system:
            block["cache_control"] = {"type": "ephemeral"}
        body["system"] = [block]
    tool: JSON = {"name": "run", "input_schema": {"type": "object"}}
    if c.cached_system:
        tool["cache_control"] = {"type": "ephemeral"}
    body["tools"] = [tool]
    body["messages"] = _within_breakpoints(messages, 4 - 2 * c.cached_system - c.cached_question)
    return body


def _within_breakpoints(messages: list[JSON], room: int) -> list[JSON]:
    """The API takes four cache breakpoints: the results' beyond `room` lose theirs (the
    newest kept, as an agent keeps its markers on the newest turns)."""
    marked = [b for m in messages if isinstance(m["content"], list) for b in m["content"]
              if b.get("type") == "tool_result" and "cache_control" in b]  # fmt: skip
    for block in marked[: max(len(marked) - room, 0)]:
        del block["cache_control"]
    return messages


BEDROCK_MODEL = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
VERTEX_MODEL = "claude-sonnet-4-5@20250929"


def bedrock_body(c: Conversation) -> JSON:
    """Messages in Bedrock's envelope: the model in the path, its API version in the body."""
    body = messages_body(c)
    del body["model"]
    return {"anthropic_version": "bedrock-2023-05-31", **body}


def vertex_body(c: Conversation) -> JSON:
    body = messages_body(c)
    del body["model"]
    return {"anthropic_version": "vertex-2023-10-16", **body}


# -- Gemini -------------------------------------------------------------------------------

GEMINI_MODEL = "gemini-2.5-flash"  # (Gemini 2.5: no thought signatures to carry)


def gemini_body(c: Conversation) -> JSON:
    """`contents` of user and model turns, as Gemini CLI sends them: function calls
    answered by position in the user turn after, results under `output` (`error` when
    they failed), an image as an inlineData part beside the responses. Server tools,
    cached system blocks and mid-conversation system messages have no Gemini meaning;
    `extra_field` (an unknown field would be refused by the API) puts the user's text
    into the turn of responses before it instead of a turn of its own."""
    contents: list[JSON] = []
    for n, turn in enumerate(c.turns):
        text = turn.user if n else f"[{c.marker}] {turn.user}"
        if turn.extra_field and contents and contents[-1]["role"] == "user":
            contents[-1]["parts"].append({"text": text})
        else:
            contents.append({"role": "user", "parts": [{"text": text}]})
        parts: list[JSON] = []
        if turn.thinking:
            parts.append({"text": "Let me see.", "thought": True})
        if turn.reply:
            parts.append({"text": turn.reply})
        for call in turn.calls:
            parts.append({"functionCall": {"name": "run", "args": call.input}})
        if not turn.calls and not turn.reply:
            parts.append({"text": "Done."})
        contents.append({"role": "model", "parts": parts})
        if turn.calls:
            answers: list[JSON] = []
            for call in turn.calls:
                key = "error" if call.is_error else "output"
                answers.append({"functionResponse": {"name": "run",
                                                     "response": {key: call.result}}})  # fmt: skip
            for call in turn.calls:
                if call.image:
                    answers.append({"inlineData": {"mimeType": "image/png", "data": PNG}})
            contents.append({"role": "user", "parts": answers})
    contents.append({"role": "user", "parts": [{"text": c.question}]})
    body: JSON = {"contents": contents}
    if c.system:
        body["systemInstruction"] = {"parts": [{"text": c.system}]}
    declaration = {"name": "run", "parametersJsonSchema": {"type": "object"}}
    body["tools"] = [{"functionDeclarations": [declaration]}]
    body["generationConfig"] = {"maxOutputTokens": 300}
    return body


# -- Chat Completions ---------------------------------------------------------------------


def chat_body(c: Conversation) -> JSON:
    messages: list[JSON] = []
    if c.system:
        messages.append({"role": "system", "content": c.system})
    for n, turn in enumerate(c.turns):
        text = turn.user if n else f"[{c.marker}] {turn.user}"
        messages.append({"role": "user", "content": text})
        assistant: JSON = {"role": "assistant", "content": turn.reply or None}
        if turn.calls:
            assistant["tool_calls"] = [
                {"id": call.id, "type": "function",
                 "function": {"name": "run", "arguments": orjson.dumps(call.input).decode()}}
                for call in turn.calls
            ]  # fmt: skip
        elif not turn.reply:
            assistant["content"] = "Done."
        messages.append(assistant)
        for call in turn.calls:
            output = f"Error: {call.result}" if call.is_error else call.result
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
        if turn.system_after:
            messages.append({"role": "developer", "content": turn.system_after})
    messages.append({"role": "user", "content": c.question})
    tool = {"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}
    return {"model": "gpt-4o", "max_tokens": 300, "tools": [tool], "messages": messages}


# -- Responses ----------------------------------------------------------------------------


def responses_body(c: Conversation) -> JSON:
    items: list[JSON] = []
    for n, turn in enumerate(c.turns):
        text = turn.user if n else f"[{c.marker}] {turn.user}"
        items.append(
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        )
        if turn.reply or not turn.calls:
            items.append({
                "type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": turn.reply or "Done."}],
            })  # fmt: skip
        for call in turn.calls:
            items.append({"type": "function_call", "call_id": call.id, "name": "run",
                          "arguments": orjson.dumps(call.input).decode()})  # fmt: skip
        for call in turn.calls:
            items.append(
                {"type": "function_call_output", "call_id": call.id, "output": call.result}
            )
        if turn.system_after:
            said = [{"type": "input_text", "text": turn.system_after}]
            items.append({"type": "message", "role": "developer", "content": said})
    items.append({"type": "message", "role": "user",
                  "content": [{"type": "input_text", "text": c.question}]})  # fmt: skip
    body: JSON = {
        "model": "gpt-5-codex",
        "max_output_tokens": 300,
        "tools": [{"type": "function", "name": "run", "parameters": {"type": "object"}}],
        "input": items,
    }
    if c.system:
        body["instructions"] = c.system
    return body


def encode(body: JSON, style: str = "compact") -> tuple[bytes, list[bytes]]:
    """The body as a client writes it (compact JSON, big integers as digits; `style`
    "ascii": every non-ASCII character escaped, "indented": two spaces a level, as
    Python's json.dumps writes them), and each history message's own bytes within it."""
    placeholder = orjson.dumps(BIG_PLACEHOLDER)

    def written(value: Any, level: int = 0) -> bytes:
        if style == "ascii":
            text = json.dumps(value, separators=(",", ":")).encode()
        elif style == "indented":
            text = json.dumps(value, indent=2, ensure_ascii=False).encode()
            # (a message's bytes within the body: indented one level deeper)
            text = text.replace(b"\n", b"\n" + b"  " * level)
        else:
            try:
                text = orjson.dumps(value)
            except TypeError:  # nested deeper than orjson writes: as Python's json does
                text = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
        return text.replace(placeholder, BIG_INT)

    history = body.get("input", body.get("messages", body.get("contents")))
    messages = [written(m, 2) for m in history] if isinstance(history, list) else []
    return written(body), messages


def byte_exact(c: Conversation, spans: list[bytes]) -> list[bytes] | None:
    """The messages' bytes a rewrite keeps byte for byte: a client's compact JSON (its
    spaces and escapes otherwise mean the same whoever writes them; its values are
    checked all the same)."""
    return spans if c.style == "compact" else None


# -- mutations: a request broken one way ---------------------------------------------------

Mutation = Callable[[JSON], JSON]


def _history(body: JSON) -> list[JSON]:
    for key in ("input", "messages", "contents"):
        if key in body:
            history: list[JSON] = body[key]
            return history
    raise KeyError("no history")


def orphan_messages(body: JSON) -> JSON:
    last = _history(body)[-1]
    last["content"].insert(0, {"type": "tool_result", "tool_use_id": "toolu_NOPE",
                               "content": "late"})  # fmt: skip
    return body


def unanswered(body: JSON) -> JSON:
    """The results of the newest calls go: their calls stay unanswered."""
    history = _history(body)
    kept = [m for m in history if not _answers(m)]
    if len(kept) == len(history):  # no call: one is made and never answered
        if "contents" in body:
            call = {"functionCall": {"name": "run", "args": {}}}
            kept.insert(-1, {"role": "model", "parts": [call]})
        elif "input" in body:
            kept.insert(-1, {"type": "function_call", "call_id": "call_open", "name": "run",
                             "arguments": "{}"})  # fmt: skip
        elif body["messages"][0].get("role") in ("user", "system") and "tools" in body:
            kept.insert(-1, _open_call(body))
    history[:] = kept
    return body


def _answers(message: JSON) -> bool:
    if message.get("type") == "function_call_output" or message.get("role") == "tool":
        return True
    parts = message.get("parts")
    if isinstance(parts, list) and any("functionResponse" in p for p in parts):
        return True
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )


def _open_call(body: JSON) -> JSON:
    if body["tools"][0].get("type") == "function":  # Chat
        return {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_open", "type": "function",
             "function": {"name": "run", "arguments": "{}"}}]}  # fmt: skip
    return {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_open",
                                              "name": "run", "input": {}}]}  # fmt: skip


def stray_tool(body: JSON) -> JSON:
    body["messages"].append({"role": "tool", "tool_call_id": "call_NOPE", "content": "late"})
    return body


def orphan_output(body: JSON) -> JSON:
    body["input"].insert(-1, {"type": "function_call_output", "call_id": "call_NOPE",
                              "output": "late"})  # fmt: skip
    return body


def orphan_response(body: JSON) -> JSON:
    """A function response no call asked for, before the question."""
    late = {"functionResponse": {"name": "run", "response": {"output": "late"}}}
    body["contents"][-1]["parts"].insert(0, late)
    return body


def empty_parts(body: JSON) -> JSON:
    body["contents"][-1]["parts"] = []
    return body


def empty_text(body: JSON) -> JSON:
    last = _history(body)[-1]
    if "parts" in last:
        last["parts"][-1]["text"] = ""
    elif isinstance(last["content"], list):
        last["content"][-1]["text"] = ""
    else:
        last["content"] = []
    return body


def unknown_role(body: JSON) -> JSON:
    _history(body)[-1]["role"] = "wizard"
    return body


def string_max_tokens(body: JSON) -> JSON:
    if "generationConfig" in body:
        body["generationConfig"]["maxOutputTokens"] = "100"
        return body
    key = "max_output_tokens" if "input" in body else "max_tokens"
    body[key] = "100"
    return body


def string_stream(body: JSON) -> JSON:
    body["stream"] = "yes"
    return body


DEPTH = 300
DEEP_BYTES = b"[" * DEPTH + b"1" + b"]" * DEPTH


def deep_input(body: JSON) -> JSON:
    """A value nested 300 levels deep (valid: orjson reads it, and writes none so deep)."""
    deep: Any = 1
    for _ in range(DEPTH):
        deep = [deep]
    last = _history(body)[-1]
    if "contents" in body:  # (a schema holds any JSON; an unknown field the API refuses)
        schema = body["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"]
        schema["properties"] = {"deep": {"type": "array", "default": deep}}
    elif "input" in body or isinstance(last.get("content"), str):
        body["metadata_blob"] = deep  # (an unknown top-level field: passed on)
    else:
        last["content"][-1]["deep"] = deep
    return body


MESSAGES_MUTATIONS: dict[str, Mutation] = {
    "orphan_result": orphan_messages,
    "unanswered_call": unanswered,
    "empty_text": empty_text,
    "string_max_tokens": string_max_tokens,
    "string_stream": string_stream,
}
MUTATIONS: dict[str, dict[str, Mutation]] = {
    "bedrock": MESSAGES_MUTATIONS,
    "vertex": MESSAGES_MUTATIONS,
    "messages": {
        "orphan_result": orphan_messages,
        "unanswered_call": unanswered,
        "empty_text": empty_text,
        "string_max_tokens": string_max_tokens,
        "string_stream": string_stream,
    },
    "chat": {
        "stray_tool": stray_tool,
        "unanswered_call": unanswered,
        "empty_content": empty_text,
        "string_max_tokens": string_max_tokens,
        "string_stream": string_stream,
    },
    # Gemini: no `stream` field (the stream is in the path), so no string_stream.
    "gemini": {
        "orphan_response": orphan_response,
        "unanswered_call": unanswered,
        "empty_text": empty_text,
        "empty_parts": empty_parts,
        "unknown_role": unknown_role,
        "string_max_tokens": string_max_tokens,
    },
    "responses": {
        "orphan_output": orphan_output,
        "unanswered_call": unanswered,
        "unknown_role": unknown_role,
        "string_max_tokens": string_max_tokens,
        "string_stream": string_stream,
    },
}


# Mutations of the bytes themselves: the proxy must answer them itself (a 4xx in the
# API's shape) or pass them on untouched, never fail.
def truncated(raw: bytes) -> bytes:
    return raw[: len(raw) * 2 // 3]


def bad_utf8(raw: bytes) -> bytes:
    return raw.replace(b"What now?", b"What \xff\xfe now?", 1).replace(b'"q0', b'"\xc3q0', 1)


def duplicate_key(raw: bytes) -> bytes:
    """The output cap given twice (every format has one; the proxy reads it)."""
    return re.sub(rb'"(max_(?:output_)?tokens|maxOutputTokens)":', rb'"\1":1,"\1":', raw, count=1)


def huge_number(raw: bytes) -> bytes:
    huge = b'"n_huge":1' + b"0" * 400 + b","
    return re.sub(rb'"(max_|generationConfig)', lambda m: huge + m.group(0), raw, count=1)


BYTE_MUTATIONS: dict[str, Callable[[bytes], bytes]] = {
    "truncated": truncated,
    "bad_utf8": bad_utf8,
    "duplicate_keys": duplicate_key,
    "huge_number": huge_number,
}


@dataclass(frozen=True)
class Format:
    name: str
    path: str
    headers: dict[str, str]
    render: Callable[[Conversation], JSON]


MESSAGES = Format(
    "messages",
    "/v1/messages",
    {"x-api-key": "sk-battery", "anthropic-version": "2023-06-01"},
    messages_body,
)
CHAT = Format("chat", "/v1/chat/completions", {"authorization": "Bearer sk-battery"}, chat_body)
RESPONSES = Format("responses", "/v1/responses", {"authorization": "Bearer sk-battery"},
                   responses_body)  # fmt: skip
BEDROCK = Format(
    "bedrock",
    f"/bedrock/model/{BEDROCK_MODEL}/invoke",
    {"authorization": "Bearer sk-battery"},  # (the proxy signs with its own credential)
    bedrock_body,
)
VERTEX = Format(
    "vertex",
    f"/vertex/v1/projects/{PROJECT}/locations/us-east5/publishers/anthropic/models/"
    f"{VERTEX_MODEL}:rawPredict",
    {"authorization": "Bearer ya29.battery"},
    vertex_body,
)
GEMINI = Format(
    "gemini",
    f"/v1beta/models/{GEMINI_MODEL}:generateContent",
    {"x-goog-api-key": "battery-gemini-key"},
    gemini_body,
)
FORMATS = {f.name: f for f in (MESSAGES, CHAT, RESPONSES, BEDROCK, VERTEX, GEMINI)}


# -- streams: the same conversations asked for as a stream ---------------------------------


@dataclass(frozen=True)
class Streamed:
    """A format's way of asking for a stream: its path and what its body says."""

    name: str
    path: str
    body: Callable[[JSON], JSON]


def _stream_field(body: JSON) -> JSON:
    return {**body, "stream": True}


def _chat_usage(body: JSON) -> JSON:
    return {**body, "stream": True, "stream_options": {"include_usage": True}}


def _same(body: JSON) -> JSON:
    return body


_STREAM_PATH = {
    "bedrock": BEDROCK.path.replace("/invoke", "/invoke-with-response-stream"),
    "vertex": VERTEX.path.replace(":rawPredict", ":streamRawPredict"),
    "gemini_sse": GEMINI.path.replace(":generateContent", ":streamGenerateContent?alt=sse"),
    "gemini_array": GEMINI.path.replace(":generateContent", ":streamGenerateContent"),
}
STREAMS: dict[str, tuple[Streamed, ...]] = {
    "messages": (Streamed("sse", MESSAGES.path, _stream_field),),
    "chat": (
        Streamed("sse", CHAT.path, _stream_field),
        Streamed("sse_usage", CHAT.path, _chat_usage),
    ),
    "responses": (Streamed("sse", RESPONSES.path, _stream_field),),
    "bedrock": (Streamed("eventstream", _STREAM_PATH["bedrock"], _same),),
    "vertex": (Streamed("sse", _STREAM_PATH["vertex"], _stream_field),),
    "gemini": (
        Streamed("sse", _STREAM_PATH["gemini_sse"], _same),
        Streamed("array", _STREAM_PATH["gemini_array"], _same),  # JSON array form
    ),
}
