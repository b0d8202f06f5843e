"""`Dialect.gives_results` says what `bool(tool_results(message))` says, in every format,
without reading the results' texts (counting asks it of large messages)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.wire_format import WireFormat
from proxy.wire.anthropic import ANTHROPIC
from proxy.wire.chat import CHAT
from proxy.wire.gemini import GEMINI
from proxy.wire.responses import RESPONSES

RESULT = {"type": "tool_result", "tool_use_id": "t1", "content": "out"}
ANTHROPIC_MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": [RESULT]},
    {"role": "user", "content": [{"type": "text", "text": "hi"}, RESULT]},
    {"role": "user", "content": [{"type": "image", "source": {}}, {**RESULT, "content": []}]},
    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    {"role": "user", "content": "plain"},
    {"role": "user", "content": ["odd", 3]},
    {"role": "assistant", "content": [RESULT]},
    {"role": "system", "content": [RESULT]},
]
CHAT_MESSAGES: list[dict[str, Any]] = [
    {"role": "tool", "tool_call_id": "c1", "content": "out"},
    {"role": "tool", "tool_call_id": "c1", "content": [{"type": "image_url"}]},
    {"role": "user", "content": "x"},
    {"role": "assistant", "content": None, "tool_calls": []},
]
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "out"}
RESPONSES_UNITS: list[dict[str, Any]] = [
    {"unit": "outputs", "items": [OUTPUT]},
    {"unit": "outputs", "items": [{"type": "custom_tool_call_output", "call_id": "c2"}]},
    {"unit": "outputs", "items": [{"type": "reasoning"}]},
    {"unit": "outputs", "items": "odd"},
    {"unit": "turn", "items": [OUTPUT]},
]


def _response(response: Any) -> dict[str, Any]:
    return {"functionResponse": {"name": "ls", "response": response}}


GEMINI_CONTENTS: list[dict[str, Any]] = [
    {"role": "user", "parts": [_response({"output": "a"})]},
    {"parts": [_response({"output": "a", "more": 1})]},
    {"role": "user", "parts": [_response("not an object")]},
    {"role": "user", "parts": [{"text": "hi"}]},
    {"role": "model", "parts": [_response({"output": "a"})]},
]


@pytest.mark.parametrize(
    ("wire", "messages"),
    [
        (ANTHROPIC, ANTHROPIC_MESSAGES),
        (CHAT, CHAT_MESSAGES),
        (RESPONSES, RESPONSES_UNITS),
        (GEMINI, GEMINI_CONTENTS),
    ],
    ids=["anthropic", "chat", "responses", "gemini"],
)
def test_gives_results_is_whether_tool_results_finds_any(
    wire: WireFormat, messages: list[dict[str, Any]]
) -> None:
    answers = [wire.gives_results(m) for m in messages]
    assert answers == [bool(wire.tool_results(m)) for m in messages]
    assert True in answers and False in answers  # (each format's cases say both)
