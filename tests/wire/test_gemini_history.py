"""The Gemini format's request side: shapes and groups, tool results and stubs, the
read_result declaration, counting, the summariser's request, usage lines and errors."""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any

import orjson

from proxy.core.errors import BudgetRefused, ContextTooLong
from proxy.core.history import group_history
from proxy.core.offload import Stub
from proxy.core.segments import stubbed as stubbed_message
from proxy.core.tokens import TokenCounter
from proxy.core.usage import LineKind, Usage
from proxy.wire.gemini import GEMINI, read_result_tool
from proxy.wire.gemini_parts import GeminiCounter

COUNTER = GeminiCounter(TokenCounter())
REF = "r_" + "0" * 16


def call(name: str, signature: str | None = None, **args: Any) -> dict[str, Any]:
    part: dict[str, Any] = {"functionCall": {"name": name, "args": args}}
    if signature:
        part["thoughtSignature"] = signature
    return part


def response(name: str, output: Any) -> dict[str, Any]:
    return {"functionResponse": {"name": name, "response": output}}


def groups(contents: list[dict[str, Any]]) -> list[tuple[str, tuple[int, ...]]]:
    shapes = [GEMINI.message_shape(c, COUNTER.count_message(c)) for c in contents]
    return [(g.kind.value, g.members) for g in group_history(shapes)]


def test_a_call_turn_and_the_turn_answering_it_are_one_group_counted_by_position() -> None:
    contents = [
        {"role": "user", "parts": [{"text": "list and read"}]},
        {"role": "model", "parts": [call("ls", "c2ln"), call("cat", path="a")]},
        {
            "role": "user",
            "parts": [response("ls", {"output": "a"}), response("cat", {"output": "x"})],
        },
        {"role": "model", "parts": [{"text": "both done"}]},
        {"role": "model", "parts": [call("ls")]},
        {"role": "user", "parts": [response("ls", {"output": "a"})] * 2},  # one too many
        {"parts": [{"text": "next"}]},  # no role: the user's
    ]
    shape = GEMINI.message_shape(contents[1], 1)
    assert shape.role == "assistant" and shape.calls == ("call0", "call1")
    assert GEMINI.message_shape(contents[2], 1).answers == ("call0", "call1")
    assert groups(contents) == [
        ("single", (0,)),
        ("pair", (1, 2)),
        ("single", (3,)),
        ("malformed", (4, 5)),
        ("pinned", (6,)),
    ]


def test_function_responses_are_offloaded_as_text_and_stubbed_in_their_field() -> None:
    plain = response("run_shell_command", {"output": "y" * 5000})
    structured = response("get", {"rows": [1, 2], "more": True})
    media = {"functionResponse": {"name": "shot", "response": {}, "parts": [{"inlineData": {}}]}}
    turn = {"role": "user", "parts": [plain, structured, media, {"text": "and a note"}]}
    results = GEMINI.tool_results(turn)
    assert [(r.block, r.call_id) for r in results] == [(0, "run_shell_command"), (1, "get")]
    assert results[0].text == "y" * 5000 and results[1].text == '{"rows":[1,2],"more":true}'
    stubbed = stubbed_message(
        GEMINI, turn, [Stub(0, REF, 100), Stub(1, REF, 5)], "read_result", 800
    )
    first = stubbed["parts"][0]["functionResponse"]
    assert first["name"] == "run_shell_command" and list(first["response"]) == ["output"]
    assert f'read_result(ref="{REF}", start=100' in first["response"]["output"]
    assert list(stubbed["parts"][1]["functionResponse"]["response"]) == ["output"]
    assert stubbed["parts"][2:] == turn["parts"][2:], "media and text parts are left alone"
    assert GEMINI.tool_results({"role": "model", "parts": [call("ls")]}) == []


def test_snake_case_fields_are_read_as_the_api_reads_them() -> None:
    turn = {
        "role": "user",
        "parts": [{"function_response": {"name": "ls", "response": {"output": "z" * 900}}}],
    }
    assert GEMINI.message_shape(turn, 1).answers == ("call0",)
    stubbed = stubbed_message(GEMINI, turn, [Stub(0, REF, 10)], "read_result", 800)
    assert "read_result(ref=" in stubbed["parts"][0]["function_response"]["response"]["output"]
    body = {
        "system_instruction": {"parts": [{"text": "be brief"}]},
        "generation_config": {"max_output_tokens": 512},
        "contents": [turn],
    }
    assert GEMINI.max_output(body) == 512
    assert GEMINI.fixed_tokens(COUNTER, body) > 0
    assert GEMINI.identity_view(body).lead == {"parts": [{"text": "be brief"}]}


def test_read_result_is_declared_beside_the_clients_functions_or_not_at_all() -> None:
    declared = {"tools": [{"googleSearch": {}}, {"functionDeclarations": [{"name": "ls"}]}]}
    tools = GEMINI.with_history(declared, [], "read_result")["tools"]
    assert tools[0] == {"googleSearch": {}}
    assert [d["name"] for d in tools[1]["functionDeclarations"]] == ["ls", "read_result"]
    assert tools[1]["functionDeclarations"][1] == read_result_tool("read_result")
    assert GEMINI.with_history({"tools": [{"googleSearch": {}}]}, [], "read_result")["tools"][
        1
    ] == {"functionDeclarations": [read_result_tool("read_result")]}
    assert GEMINI.with_history({}, [], "read_result")["tools"] == [
        {"functionDeclarations": [read_result_tool("read_result")]}
    ]
    assert GEMINI.tool_name({}) == "read_result"
    taken = {"tools": [{"functionDeclarations": [{"name": "read_result"}]}]}
    assert GEMINI.tool_name(taken) == "compaction_proxy_read_result"
    json_mode = {"generationConfig": {"responseMimeType": "application/json"}}
    assert GEMINI.tool_name(json_mode) is None, "the API refuses functions beside JSON"
    assert GEMINI.tool_name({"generationConfig": {"responseJsonSchema": {}}}) is None
    assert GEMINI.tool_name({"cachedContent": "cachedContents/x"}) is None
    assert GEMINI.tool_name({"generationConfig": {"candidateCount": 2}}) is None
    schema = read_result_tool("read_result")["parametersJsonSchema"]
    assert schema["required"] == ["ref"] and orjson.dumps(read_result_tool("read_result")) == (
        orjson.dumps(read_result_tool("read_result"))
    )


def _png(width: int, height: int) -> str:
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + header
    body = struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk))
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + body).decode()


def test_media_is_counted_as_gemini_counts_it() -> None:
    def tokens(part: dict[str, Any]) -> int:
        return COUNTER.count_block(part)

    small = {"inlineData": {"mimeType": "image/png", "data": _png(300, 300)}}
    huge = {"inlineData": {"mimeType": "image/png", "data": _png(4000, 3000)}}
    assert tokens(small) == 1120, "Gemini 3's default (high) resolution"
    assert tokens(huge) == 6 * 4 * 258, "2.x tiles cost more for a large image: the larger"
    low = {**small, "mediaResolution": {"level": "MEDIA_RESOLUTION_LOW"}}
    assert tokens(low) == 280
    pdf = base64.b64encode(b"%PDF-1.4 /Type /Page /Type /Page /Type /Pages").decode()
    assert tokens({"inlineData": {"mimeType": "application/pdf", "data": pdf}}) == 2 * 560
    uri = {"fileData": {"mimeType": "video/mp4", "fileUri": "https://x/files/v"}}
    assert tokens(uri) == 60 * 263
    text = base64.b64encode(b"hello world").decode()
    assert tokens({"inline_data": {"mime_type": "text/plain", "data": text}}) == 2
    assert tokens({"text": "hi", "thoughtSignature": "A" * 4000}) == tokens({"text": "hi"})


def test_the_summary_request_in_place_keeps_the_prefix_and_asks_for_text() -> None:
    body = {
        "contents": [{"role": "user", "parts": [{"text": "task"}]}],
        "systemInstruction": {"parts": [{"text": "rules"}]},
        "tools": [{"functionDeclarations": [{"name": "ls"}]}],
        "generationConfig": {
            "temperature": 1,
            "maxOutputTokens": 100,
            "thinkingConfig": {"includeThoughts": True, "thinkingLevel": "HIGH"},
        },
    }
    history = [{"role": "user", "parts": [{"text": "old"}]}]
    out = GEMINI.summary_request(
        body, model="gemini-3-flash-preview", summary_tokens=2000, prompt="notes?", history=history
    )
    assert out is not None
    assert out["systemInstruction"] == body["systemInstruction"] and out["tools"] == body["tools"]
    assert out["contents"] == [*history, {"role": "user", "parts": [{"text": "notes?"}]}]
    config = out["generationConfig"]
    assert config == {
        "temperature": 1,
        "maxOutputTokens": 2000,
        "thinkingConfig": {"thinkingLevel": "low"},
    }
    budget = {"generationConfig": {"thinkingConfig": {"thinkingBudget": 500}}}
    got = GEMINI.summary_request(
        budget, model="gemini-2.5-pro", summary_tokens=2000, prompt="p", history=history
    )
    assert got is not None and got["generationConfig"]["maxOutputTokens"] == 2500
    forced = {"toolConfig": {"functionCallingConfig": {"mode": "ANY"}}}
    assert (
        GEMINI.summary_request(forced, model="m", summary_tokens=1, prompt="p", history=[]) is None
    )
    alone = GEMINI.summary_request(body, model="m", summary_tokens=50, prompt="tx", history=None)
    assert alone is not None and alone["contents"] == [{"role": "user", "parts": [{"text": "tx"}]}]
    assert alone["generationConfig"] == {"maxOutputTokens": 50}
    answer = {
        "candidates": [
            {"content": {"parts": [{"text": "thinking", "thought": True}, {"text": "notes"}]}}
        ]
    }
    assert GEMINI.answer_text(answer) == "notes"


def test_usage_is_read_from_the_final_chunk_and_whole_answers() -> None:
    usage = {
        "promptTokenCount": 1000,
        "cachedContentTokenCount": 600,
        "candidatesTokenCount": 50,
        "thoughtsTokenCount": 30,
        "totalTokenCount": 1080,
    }
    expected = Usage(input_tokens=400, cache_read_input_tokens=600, output_tokens=80)
    assert GEMINI.usage(usage) == expected
    assert GEMINI.body_usage({"usageMetadata": usage}) == expected
    middle = {"candidates": [{"content": {"parts": [{"text": "a"}]}}], "usageMetadata": usage}
    final = {**middle, "candidates": [{**middle["candidates"][0], "finishReason": "STOP"}]}
    assert GEMINI.usage_line(b"data: " + orjson.dumps(middle)) is None
    assert GEMINI.usage_line(b"data: " + orjson.dumps(final)) == (LineKind.END, expected)
    assert GEMINI.line_may_matter(b'data: {"candidates"')


def test_errors_are_in_googles_shape() -> None:
    body = orjson.loads(GEMINI.error_body(ContextTooLong("too long"), "req"))
    assert body == {"error": {"code": 400, "message": "too long", "status": "INVALID_ARGUMENT"}}
    refused = orjson.loads(GEMINI.error_body(BudgetRefused("spent", retry_after=30), "req"))
    assert refused["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert refused["error"]["details"][0]["retryDelay"] == "30s"
    event = GEMINI.stream_error(ContextTooLong("cut"))
    assert event.startswith(b"data: {") and event.endswith(b"\r\n\r\n")
    upstream = {"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}
    assert orjson.loads(GEMINI.upstream_stream_error(upstream, 503)[6:]) == upstream
    assert b'"UNAVAILABLE"' in GEMINI.upstream_stream_error(None, 503)
