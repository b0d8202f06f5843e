"""The Anthropic adapter on recorded agent requests and generated conversations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.exact_json import ClientJSON
from proxy.core.history import GroupKind, Shape, group_history, pack_messages
from proxy.core.pack import pack_context
from proxy.wire.anthropic import history_shapes, message_shape
from proxy.wire.common import request_messages

AGENT = Path(__file__).parents[1] / "fixtures" / "agent-requests"


def _length(message: Any) -> int:
    return len(orjson.dumps(message)) // 4 + 1


def _fixture(name: str) -> dict[str, Any]:
    return json.loads((AGENT / name).read_text())


def test_recorded_turn7_groups() -> None:
    body = _fixture("claude-code-turn7.json")["body"]
    messages = request_messages(body)
    groups = group_history(history_shapes(messages, _length))
    got = [(g.kind.value, g.members) for g in groups]
    assert got == [
        ("pinned", (0,)),  # the task: the last ordinary user message
        ("pinned", (1,)),  # a mid-conversation system message
        ("pair", (2, 3)),
        ("pair", (4, 5)),
        ("pair", (6, 7)),
        ("pair", (8, 9)),
        ("pair", (10, 11)),
        ("pinned", (12,)),
        ("pinned", (13, 14)),  # the turn in progress
    ]


def test_recorded_turn1_is_all_pinned() -> None:
    body = _fixture("claude-code-turn1.json")["body"]
    groups = group_history(history_shapes(request_messages(body), _length))
    assert all(g.kind is GroupKind.PINNED for g in groups)


def test_a_rewrite_round_trips_every_field_and_keeps_key_order() -> None:
    for name in ("claude-code-turn1.json", "claude-code-turn7.json"):
        body = {**_fixture(name)["body"], "brand_new_field": {"x": [1, 2]}}
        raw = orjson.dumps(body, option=orjson.OPT_INDENT_2)  # spelled otherwise than orjson
        parsed = orjson.loads(raw)
        source = ClientJSON(raw, parsed)
        assert orjson.loads(source.encode(parsed)) == body
        out = orjson.loads(source.encode({**parsed, "messages": parsed["messages"][:1]}))
        assert list(out) == list(body)
        assert out["brand_new_field"] == {"x": [1, 2]}


def test_shapes_of_unknown_blocks_and_roles() -> None:
    assert message_shape({"role": "user", "content": "hi"}, 3) == Shape("user", 3)
    odd = {"role": "user", "content": [{"type": "future_block", "x": 1}]}
    assert message_shape(odd, 1) == Shape("user", 1)
    mixed = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "t", "signature": "s"},
            {"type": "tool_use", "id": "a", "name": "Bash", "input": {}},
            {"type": "server_tool_use", "id": "srv", "name": "web_search", "input": {}},
            {"type": "tool_use", "id": "b", "name": "Read", "input": {}},
        ],
    }
    assert message_shape(mixed, 1).calls == ("a", "b")
    assert message_shape({"role": "system", "content": [{"type": "text"}]}, 1).role == "system"


# --- generated conversations: packing never breaks the API's pairing rules ---------------


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "task " * draw(st.integers(1, 50))}
    ]
    call = 0
    for _ in range(draw(st.integers(0, 25))):
        step = draw(st.sampled_from(["tools", "tools", "text", "user", "system"]))
        if step == "tools":
            ids = [f"toolu_{call + k}" for k in range(draw(st.integers(1, 3)))]
            call += len(ids)
            messages.append(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": i, "name": "Bash", "input": {}} for i in ids
                    ],
                }
            )
            size = draw(st.integers(1, 400))
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": i, "content": "x " * size}
                        for i in ids
                    ],
                }
            )
        elif step == "text":
            messages.append({"role": "assistant", "content": "ok " * draw(st.integers(1, 40))})
        elif step == "user":
            if messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": "sure"})
            messages.append({"role": "user", "content": "more " * draw(st.integers(1, 40))})
        else:
            messages.append({"role": "system", "content": "reminder"})
    return messages


def _pairing_errors(messages: list[dict[str, Any]]) -> list[str]:
    """The API's pairing rules, on the sequence with consecutive same roles merged."""
    merged: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "system":
            continue
        blocks = m["content"] if isinstance(m["content"], list) else [{"type": "text"}]
        if merged and merged[-1]["role"] == m["role"]:
            merged[-1]["blocks"] += blocks
        else:
            merged.append({"role": m["role"], "blocks": list(blocks)})
    errors = []
    for n, m in enumerate(merged):
        if m["role"] != "assistant":
            continue
        calls = [b["id"] for b in m["blocks"] if b.get("type") == "tool_use"]
        following = merged[n + 1]["blocks"] if n + 1 < len(merged) else []
        answered = [b["tool_use_id"] for b in following if b.get("type") == "tool_result"]
        if set(calls) != set(answered):
            errors.append(f"message {n}: calls {calls} answered by {answered}")
        leading = [b.get("type") == "tool_result" for b in following]
        if any(leading) and leading != sorted(leading, reverse=True):
            errors.append(f"message {n + 1}: tool_result blocks are not first")
    return errors


@settings(max_examples=600)
@given(conversations(), st.integers(50, 3000))
def test_packing_keeps_every_call_answered(messages: list[dict[str, Any]], budget: int) -> None:
    assert _pairing_errors(messages) == []
    shapes = history_shapes(messages, _length)
    groups = group_history(shapes)
    result = pack_context(pack_messages(groups, shapes), budget, 20)
    if result is None:
        return
    kept = [messages[i] for i in result["keep"]]
    assert _pairing_errors(kept) == []
    assert result["keep"][-1] == len(messages) - 1, "the turn in progress was dropped"
