"""The OpenAI Chat adapter: shapes, groups, and packing that keeps the pairing rules."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.history import GroupKind, Shape, group_history, pack_messages
from proxy.core.pack import pack_context
from proxy.core.segments import stubbed as stubbed_message
from proxy.core.tokens import TokenCounter
from proxy.wire.chat import (
    CHAT,
    ChatCounter,
    choose_tool_name,
    identity_view,
    message_shape,
    read_result_tool,
    render_transcript,
)
from proxy.wire.chat_validation import validate_chat_request

COUNTER = ChatCounter(TokenCounter())


def call(i: str, name: str = "Bash", arguments: str = "{}") -> dict[str, Any]:
    return {"id": i, "type": "function", "function": {"name": name, "arguments": arguments}}


def pairing_error(messages: list[dict[str, Any]]) -> str | None:
    """The stand-in's strict validation (OpenAI's rules), on a minimal body."""
    error = validate_chat_request({"model": "gpt-test", "messages": messages})
    return error.message if error else None


def test_shapes() -> None:
    assistant = {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")]}
    assert message_shape(assistant, 5) == Shape("assistant", 5, calls=("a", "b"))
    tool = {"role": "tool", "tool_call_id": "a", "content": "out"}
    assert message_shape(tool, 3) == Shape("tool", 3, answers=("a",))
    assert message_shape({"role": "developer", "content": "x"}, 1).role == "developer"
    assert message_shape({"role": "user", "content": [{"type": "text", "text": "x"}]}, 1) == Shape(
        "user", 1
    )


def test_groups_pair_calls_with_tool_messages_and_pin_system() -> None:
    messages = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")]},
        {"role": "tool", "tool_call_id": "a", "content": "one"},
        {"role": "tool", "tool_call_id": "b", "content": "two"},
        {"role": "assistant", "content": "done"},
        {"role": "tool", "tool_call_id": "ghost", "content": "orphan"},
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": "next"},
    ]
    shapes = [CHAT.message_shape(m, COUNTER.count_message(m)) for m in messages]
    got = [(g.kind.value, g.members) for g in group_history(shapes)]
    assert got == [
        ("pinned", (0,)),
        ("single", (1,)),
        ("pair", (2, 3, 4)),
        ("single", (5,)),
        ("malformed", (6,)),
        ("pinned", (7,)),
        ("pinned", (8,)),
    ]


def test_stubs_summaries_and_notes_are_valid_chat_messages() -> None:
    from proxy.core.offload import Stub

    tool = {"role": "tool", "tool_call_id": "a", "content": "x" * 5000, "name": "Bash"}
    stubbed = stubbed_message(CHAT, tool, [Stub(0, "r_" + "0" * 16, 100)], "read_result", 800)
    assert stubbed["tool_call_id"] == "a" and stubbed["name"] == "Bash"
    assert 'read_result(ref="r_0000000000000000", start=100' in stubbed["content"]
    parts = {**tool, "content": [{"type": "text", "text": "y" * 5000}]}
    stubbed = stubbed_message(CHAT, parts, [Stub(0, "r_" + "1" * 16, 100)], "read_result", 800)
    assert stubbed["content"][0]["type"] == "text" and len(stubbed["content"]) == 1
    assert CHAT.summary_message("notes", 4)["role"] == "user"
    assert isinstance(CHAT.note_message("dropped")["content"], str)
    assert CHAT.tool_results({"role": "user", "content": "x"}) == []
    assert CHAT.tool_results(tool)[0].block == 0


def test_read_result_tool_and_names() -> None:
    tool = read_result_tool("read_result")
    assert tool["type"] == "function" and tool["function"]["name"] == "read_result"
    assert tool["function"]["parameters"]["required"] == ["ref"]
    assert orjson.dumps(read_result_tool("read_result")) == orjson.dumps(tool)
    assert choose_tool_name([]) == "read_result"
    taken = [{"type": "function", "function": {"name": "read_result"}}]
    assert choose_tool_name(taken) == "compaction_proxy_read_result"


def test_transcript_names_calls_and_results() -> None:
    text = render_transcript(
        [
            {"role": "user", "content": [{"type": "text", "text": "fix src/app.py"}]},
            {"role": "assistant", "content": None, "tool_calls": [call("c1", "Read", '{"p":1}')]},
            {"role": "tool", "tool_call_id": "c1", "content": "line 42"},
        ]
    )
    assert "fix src/app.py" in text and '[tool call Read id=c1] {"p":1}' in text
    assert "[tool result id=c1]\nline 42" in text


def test_identity_skips_the_shared_system_prompt() -> None:
    a = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}]}
    b = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "b"}]}
    assert identity_view(a) != identity_view(b)
    assert identity_view(a).lead == [{"role": "system", "content": "s"}]


def test_counter_counts_tool_calls_and_results() -> None:
    bare = {"role": "assistant", "content": None}
    with_call = {**bare, "tool_calls": [call("a", "Bash", '{"command": "make all"}')]}
    assert COUNTER.count_message(with_call) > COUNTER.count_message(bare)
    body = {"messages": [with_call], "tools": [read_result_tool("read_result")]}
    assert COUNTER.count_request(body) > COUNTER.count_message(with_call)


# --- generated conversations: packing never breaks OpenAI's pairing rules ---------------


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "rules"}]
    messages.append({"role": "user", "content": "task " * draw(st.integers(1, 50))})
    n = 0
    for _ in range(draw(st.integers(0, 25))):
        step = draw(st.sampled_from(["tools", "tools", "text", "user", "developer"]))
        if step == "tools":
            ids = [f"call_{n + k}" for k in range(draw(st.integers(1, 3)))]
            n += len(ids)
            text = draw(st.sampled_from([None, "let me look"]))
            messages.append(
                {"role": "assistant", "content": text, "tool_calls": [call(i) for i in ids]}
            )
            for i in ids:
                size = draw(st.integers(1, 400))
                content: Any = "x " * size
                if draw(st.booleans()):
                    content = [{"type": "text", "text": content}]
                messages.append({"role": "tool", "tool_call_id": i, "content": content})
        elif step == "text":
            messages.append({"role": "assistant", "content": "ok " * draw(st.integers(1, 40))})
        elif step == "user":
            messages.append({"role": "user", "content": "more " * draw(st.integers(1, 40))})
        else:
            messages.append({"role": "developer", "content": "reminder"})
    return messages


@settings(max_examples=400)
@given(conversations(), st.integers(50, 3000))
def test_packing_keeps_every_call_answered(messages: list[dict[str, Any]], budget: int) -> None:
    assert pairing_error(messages) is None
    shapes = [CHAT.message_shape(m, COUNTER.count_message(m)) for m in messages]
    groups = group_history(shapes)
    assert all(g.kind is not GroupKind.MALFORMED for g in groups)
    result = pack_context(pack_messages(groups, shapes), budget, 20)
    if result is None:
        return
    kept = [messages[i] for i in result["keep"]]
    assert pairing_error(kept) is None
    assert result["keep"][-1] == len(messages) - 1, "the turn in progress was dropped"
    assert all(messages[i] in kept for i, m in enumerate(messages) if m["role"] == "system")
