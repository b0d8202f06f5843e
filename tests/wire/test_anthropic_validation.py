"""Each validation rule of the stand-in, with a request it accepts and one it rejects."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from proxy.wire.anthropic_validation import (
    thinking_signature,
    validate_count_tokens_request,
    validate_messages_request,
    window_error,
)

# The Messages requests (Claude Code); the Codex ones are test_responses_*.py's.
AGENT_REQUESTS = sorted(
    (Path(__file__).parents[1] / "fixtures" / "agent-requests").glob("claude-code-*.json")
)


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def call(tool_id: str, name: str = "Bash") -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": {"command": "ls"}}


def result(tool_id: str, text: str = "a.txt b.txt") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_id, "content": text}


def text(value: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": value, **extra}


def request(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 4096, "messages": messages, **extra}


TOOLS = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]
EPHEMERAL = {"type": "ephemeral"}

ACCEPTED = {
    "plain string": request([user("hello")]),
    "blocks": request([user([text("hello"), text("again")])]),
    "tool round trip": request(
        [user("list"), assistant([text("Listing."), call("toolu_1")]), user([result("toolu_1")])],
        tools=TOOLS,
    ),
    "parallel calls answered in one message": request(
        [
            user("list"),
            assistant([call("toolu_1"), call("toolu_2")]),
            user([result("toolu_2"), result("toolu_1"), text("and then?")]),
        ]
    ),
    "results split over consecutive user messages (merged)": request(
        [
            user("list"),
            assistant([call("toolu_1"), call("toolu_2")]),
            user([result("toolu_1")]),
            user([result("toolu_2")]),
        ]
    ),
    "system role mid-conversation": request(
        [user("hi"), {"role": "system", "content": "Be brief."}, assistant("ok"), user("go")]
    ),
    "system message between call and result": request(
        [
            user("list"),
            assistant([call("toolu_1")]),
            {"role": "system", "content": "reminder"},
            user([result("toolu_1")]),
        ]
    ),
    "consecutive user messages": request([user("a"), user("b")]),
    "prefill": request([user("hi"), assistant("The answer is")]),
    "empty prefill string": request([user("hi"), assistant("")]),
    "tool_result with block content": request(
        [
            user("x"),
            assistant([call("toolu_1")]),
            user([{"type": "tool_result", "tool_use_id": "toolu_1", "content": [text("out")]}]),
        ]
    ),
    "empty tool_result content": request(
        [user("x"), assistant([call("toolu_1")]), user([result("toolu_1", "")])]
    ),
    "four cache_control blocks": request(
        [user([text("a", cache_control=EPHEMERAL), text("b", cache_control=EPHEMERAL)])],
        system=[text("s", cache_control=EPHEMERAL)],
        tools=[{**TOOLS[0], "cache_control": EPHEMERAL}],
    ),
    "thinking block with signature": request(
        [
            user("x"),
            assistant(
                [{"type": "thinking", "thinking": "hmm", "signature": "sig"}, call("toolu_1")]
            ),
            user([result("toolu_1")]),
        ],
        thinking={"type": "enabled", "budget_tokens": 1024},
    ),
    "stand-in signed thinking unmodified": request(
        [
            user("x"),
            assistant(
                [
                    {"type": "thinking", "thinking": "hmm", "signature": thinking_signature("hmm")},
                    call("toolu_1"),
                ]
            ),
            user([result("toolu_1")]),
        ],
        thinking={"type": "adaptive"},
    ),
    "redacted thinking with data": request(
        [user("x"), assistant([{"type": "redacted_thinking", "data": "EmwKAhgB"}, text("ok")])]
    ),
    "unknown block type": request([user([{"type": "future_block", "x": 1}])]),
    "unknown top-level field": request([user("x")], context_management={"edits": []}),
    "server tool without input_schema": request(
        [user("x")], tools=[{"type": "web_search_20250305", "name": "web_search"}]
    ),
}

REJECTED = {
    "no model": ({"max_tokens": 5, "messages": [user("x")]}, "model: Field required"),
    "no max_tokens": ({"model": "m", "messages": [user("x")]}, "max_tokens: Field required"),
    "zero max_tokens": (request([user("x")], max_tokens=0), "greater than or equal to 1"),
    "string max_tokens": (request([user("x")], max_tokens="5"), "valid integer"),
    "no messages": ({"model": "m", "max_tokens": 5}, "messages: Field required"),
    "empty messages": (request([]), "messages: at least one message is required"),
    "bad role": (request([{"role": "tool", "content": "x"}]), "messages.0.role"),
    "content neither string nor list": (request([user(5)]), "messages.0.content"),
    "empty string content": (request([user("")]), "messages.0: all messages must have non-empty"),
    "whitespace string content": (request([user("  \n")]), "non-whitespace text"),
    "empty content list": (request([user([])]), "messages.0: all messages must have non-empty"),
    "empty text block": (
        request([user([text("")])]),
        "messages.0.content.0: text content blocks must be non-empty",
    ),
    "whitespace text block": (
        request([user("x"), assistant([text(" \t")]), user("y")]),
        "messages.1.content.0: text content blocks must contain non-whitespace text",
    ),
    "empty system block": (
        request([user("x")], system=[text("")]),
        "system.0: text content blocks must be non-empty",
    ),
    "empty text inside a tool_result": (
        request(
            [
                user("x"),
                assistant([call("toolu_1")]),
                user([{"type": "tool_result", "tool_use_id": "toolu_1", "content": [text("")]}]),
            ]
        ),
        "messages.2.content.0.content.0: text content blocks must be non-empty",
    ),
    "prefill with trailing whitespace": (
        request([user("hi"), assistant("The answer is ")]),
        "final assistant content cannot end with trailing whitespace",
    ),
    "prefill block with trailing whitespace": (
        request([user("hi"), assistant([text("The answer is\n")])]),
        "final assistant content cannot end with trailing whitespace",
    ),
    "tool_use without result": (
        request([user("x"), assistant([call("toolu_x")]), user("never mind")]),
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: "
        "toolu_x. Each `tool_use` block must have a corresponding `tool_result` block in the "
        "next message.",
    ),
    "tool_use as the last message": (
        request([user("x"), assistant([call("toolu_x")])]),
        "`tool_use` ids were found without `tool_result` blocks immediately after: toolu_x.",
    ),
    "one of two parallel calls unanswered": (
        request(
            [user("x"), assistant([call("toolu_1"), call("toolu_2")]), user([result("toolu_1")])]
        ),
        "immediately after: toolu_2.",
    ),
    "result two messages later": (
        request(
            [
                user("x"),
                assistant([call("toolu_1")]),
                user("wait"),
                assistant("ok"),
                user([result("toolu_1")]),
            ]
        ),
        "immediately after: toolu_1.",
    ),
    "result after text in its message": (
        request([user("x"), assistant([call("toolu_1")]), user([text("here"), result("toolu_1")])]),
        "immediately after: toolu_1.",
    ),
    "result after text in a merged user message": (
        request([user("x"), assistant([call("toolu_1")]), user("here"), user([result("toolu_1")])]),
        "immediately after: toolu_1.",
    ),
    "result without a call": (
        request([user("x"), assistant("ok"), user([result("toolu_9")])]),
        "messages.2: unexpected `tool_use_id` found in `tool_result` blocks: toolu_9. Each "
        "`tool_result` block must have a corresponding `tool_use` block in the previous message.",
    ),
    "result as the first message": (
        request([user([result("toolu_9")])]),
        "unexpected `tool_use_id` found in `tool_result` blocks: toolu_9.",
    ),
    "result answering an older call": (
        request(
            [
                user("x"),
                assistant([call("toolu_1")]),
                user([result("toolu_1")]),
                assistant([call("toolu_2")]),
                user([result("toolu_2"), result("toolu_1")]),
            ]
        ),
        "unexpected `tool_use_id` found in `tool_result` blocks: toolu_1.",
    ),
    "duplicate tool_use ids": (
        request(
            [
                user("x"),
                assistant([call("toolu_1")]),
                user([result("toolu_1")]),
                assistant([call("toolu_1")]),
                user([result("toolu_1")]),
            ]
        ),
        "messages.3: `tool_use` ids must be unique",
    ),
    "tool_use in a user message": (
        request([user([call("toolu_1")])]),
        "`tool_use` blocks can only be in `assistant` messages",
    ),
    "five cache_control blocks": (
        request(
            [user([text(c, cache_control=EPHEMERAL) for c in "abcd"])],
            system=[text("s", cache_control=EPHEMERAL)],
        ),
        "A maximum of 4 blocks with cache_control may be provided. Found 5.",
    ),
    "cache_control inside tool_result content counts": (
        request(
            [
                user([text(c, cache_control=EPHEMERAL) for c in "abc"]),
                assistant([call("toolu_1")]),
                user(
                    [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [text("r", cache_control=EPHEMERAL)],
                            "cache_control": EPHEMERAL,
                        }
                    ]
                ),
            ]
        ),
        "Found 5.",
    ),
    "top-level cache_control takes a slot": (
        request(
            [user([text(c, cache_control=EPHEMERAL) for c in "abcd"])], cache_control=EPHEMERAL
        ),
        "Found 5.",
    ),
    "thinking without signature": (
        request([user("x"), assistant([{"type": "thinking", "thinking": "hmm"}, text("ok")])]),
        "messages.1.content.0.signature: Field required",
    ),
    "redacted thinking without data": (
        request([user("x"), assistant([{"type": "redacted_thinking"}, text("ok")])]),
        "messages.1.content.0.data: Field required",
    ),
    "stand-in signed thinking modified in the latest turn": (
        request(
            [
                user("x"),
                assistant(
                    [
                        {
                            "type": "thinking",
                            "thinking": "hm",
                            "signature": thinking_signature("hmm"),
                        },
                        call("toolu_1"),
                    ]
                ),
                user([result("toolu_1")]),
            ],
            thinking={"type": "enabled", "budget_tokens": 1024},
        ),
        "`thinking` or `redacted_thinking` blocks in the latest assistant message cannot be "
        "modified.",
    ),
    "thinking budget under the minimum": (
        request([user("x")], thinking={"type": "enabled", "budget_tokens": 100}),
        "budget_tokens: Input should be greater than or equal to 1024",
    ),
    "thinking budget not under max_tokens": (
        request([user("x")], max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 2000}),
        "`max_tokens` must be greater than `thinking.budget_tokens`",
    ),
    "duplicate tool names": (
        request([user("x")], tools=[TOOLS[0], TOOLS[0]]),
        "tools: Tool names must be unique.",
    ),
    "custom tool without schema": (
        request([user("x")], tools=[{"name": "Bash"}]),
        "tools.0.custom.input_schema: Field required",
    ),
    "stream not a boolean": (request([user("x")], stream="yes"), "stream:"),
    "system not text blocks": (request([user("x")], system=[{"type": "image"}]), "system.0"),
}


@pytest.mark.parametrize("body", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_accepted(body: dict[str, Any]) -> None:
    assert validate_messages_request(body) is None


@pytest.mark.parametrize(("body", "message"), REJECTED.values(), ids=REJECTED.keys())
def test_rejected(body: dict[str, Any], message: str) -> None:
    error = validate_messages_request(body)
    assert error is not None
    assert message in error


def test_signed_thinking_of_an_older_turn_is_not_checked() -> None:
    """The API only holds the latest assistant turn's thinking to be unmodified."""
    body = request(
        [
            user("x"),
            assistant(
                [
                    {
                        "type": "thinking",
                        "thinking": "edited",
                        "signature": thinking_signature("a"),
                    },
                    text("ok"),
                ]
            ),
            user("y"),
            assistant("done"),
            user("z"),
        ],
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert validate_messages_request(body) is None


@pytest.mark.parametrize("path", AGENT_REQUESTS, ids=[p.name for p in AGENT_REQUESTS])
def test_recorded_agent_requests_are_accepted(path: Path) -> None:
    body = json.loads(path.read_text())["body"]
    assert validate_messages_request(body) is None
    count_body = {k: v for k, v in body.items() if k not in ("max_tokens", "stream")}
    assert validate_count_tokens_request(count_body) is None


def test_recorded_agent_request_with_a_dropped_result_is_rejected() -> None:
    body = json.loads(AGENT_REQUESTS[-1].read_text())["body"]
    broken = copy.deepcopy(body)
    broken["messages"][-1]["content"] = [text("continue")]
    error = validate_messages_request(broken)
    assert error is not None
    assert "`tool_use` ids were found without `tool_result` blocks immediately after" in error


def test_count_tokens_request_needs_no_max_tokens() -> None:
    assert validate_count_tokens_request({"model": "m", "messages": [user("x")]}) is None
    assert validate_count_tokens_request({"model": "m", "messages": []}) is not None


def test_window() -> None:
    assert window_error(200_000, 200_000) is None
    assert window_error(219_898, 200_000) == "prompt is too long: 219898 tokens > 200000 maximum"


# -- properties: well-formed conversations pass, and losing any result is caught ---------

GROUP = st.one_of(
    st.just("say"),  # an assistant text answer, then a user text
    st.integers(min_value=1, max_value=3),  # an assistant with n calls, then their results
)


def conversation(groups: list[str | int], system_every: int) -> list[dict[str, Any]]:
    messages = [user("start")]
    ids = (f"toolu_{i:03d}" for i in range(1000))
    for g, group in enumerate(groups):
        if system_every and g % system_every == 0:
            messages.append({"role": "system", "content": f"note {g}"})
        if group == "say":
            messages += [assistant("ok"), user("next")]
            continue
        calls = [call(next(ids)) for _ in range(int(group))]
        messages += [assistant([text("Running."), *calls]), user([result(c["id"]) for c in calls])]
    return messages


@given(st.lists(GROUP, max_size=8), st.integers(min_value=0, max_value=3))
def test_generated_conversations_are_accepted(groups: list[str | int], every: int) -> None:
    assert validate_messages_request(request(conversation(groups, every))) is None


@given(st.lists(GROUP, min_size=1, max_size=8), st.integers(min_value=0, max_value=3), st.data())
def test_dropping_any_result_is_rejected(
    groups: list[str | int], every: int, data: st.DataObject
) -> None:
    messages = conversation(groups, every)
    holders = [
        (i, j)
        for i, m in enumerate(messages)
        if isinstance(m["content"], list)
        for j, b in enumerate(m["content"])
        if b["type"] == "tool_result"
    ]
    assume(holders)
    i, j = data.draw(st.sampled_from(holders))
    del messages[i]["content"][j]
    if not messages[i]["content"]:
        messages[i]["content"] = "continue"
    error = validate_messages_request(request(messages))
    assert error is not None and "without `tool_result` blocks immediately after" in error


@given(st.lists(GROUP, min_size=1, max_size=8), st.data())
def test_dropping_any_call_is_rejected(groups: list[str | int], data: st.DataObject) -> None:
    messages = conversation(groups, 0)
    holders = [
        (i, j)
        for i, m in enumerate(messages)
        if isinstance(m["content"], list)
        for j, b in enumerate(m["content"])
        if b["type"] == "tool_use"
    ]
    assume(holders)
    i, j = data.draw(st.sampled_from(holders))
    del messages[i]["content"][j]
    error = validate_messages_request(request(messages))
    assert error is not None and "unexpected `tool_use_id`" in error
