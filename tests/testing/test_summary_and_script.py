"""The summariser's answer and the script's choices, as pure functions."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.tokens import TokenCounter
from proxy.testing.api_messages import message, read
from proxy.testing.prompt import next_ref_to_read
from proxy.testing.reply import Usage
from proxy.testing.script import Script, ScriptError, decide, parse_script
from proxy.testing.summary import identifiers
from proxy.testing.summary import summarise as summarise_entries

COUNTER = TokenCounter()


def summarise(body: dict[str, Any], counter: TokenCounter) -> str:
    """The summary of a Messages body's history, within its max_tokens."""
    return summarise_entries(read(body).entries, body["max_tokens"], counter)


def plan_answer(body: dict[str, Any], script: Script, digest: str) -> dict[str, Any]:
    """The stand-in's whole Messages answer to the body."""
    return message(body["model"], decide(read(body), script, COUNTER, digest), Usage(1))


REF_A = "r_0123456789abcdef"
REF_B = "r_fedcba9876543210aa"


def stub(ref: str) -> str:
    return f'[first 2000 of 48213 characters] read_result(ref="{ref}", start=0, length=2000)'


def conversation() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Fix the crash in src/proxy/server/app.py at line 214."},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Reading it."},
                {
                    "type": "tool_use",
                    "id": "toolu_01AbC",
                    "name": "Read",
                    "input": {"path": "src/proxy/server/app.py"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01AbC",
                    "content": "class UpstreamClient:\n  def open_stream(max_idle_seconds=30): ...",
                }
            ],
        },
        {"role": "assistant", "content": "The UpstreamClient leaks; commit 9f2c4e1a8b fixes it."},
    ]


def test_summary_keeps_identifiers_verbatim() -> None:
    body = {"model": "m", "max_tokens": 400, "messages": conversation()}
    summary = summarise(body, COUNTER)
    for name in (
        "src/proxy/server/app.py",
        "214",
        "toolu_01AbC",
        "UpstreamClient",
        "open_stream",
        "max_idle_seconds",
        "9f2c4e1a8b",
    ):
        assert name in summary
    assert summary == summarise(body, COUNTER)


def test_an_attentive_summary_keeps_what_it_is_shown_whole_and_nothing_else() -> None:
    body = {"model": "m", "max_tokens": 60, "messages": conversation() * 20}
    keeps = ("max_idle_seconds=30", "9f2c4e1a8b fixes", "port 9187")
    summary = summarise_entries(read(body).entries, body["max_tokens"], COUNTER, keeps=keeps)
    assert "Kept: max_idle_seconds=30; 9f2c4e1a8b fixes\n" in summary
    assert "port 9187" not in summary
    assert COUNTER.count_text(summary) <= body["max_tokens"]


@given(st.integers(min_value=8, max_value=300))
def test_summary_fits_max_tokens(max_tokens: int) -> None:
    body = {"model": "m", "max_tokens": max_tokens, "messages": conversation() * 5}
    assert COUNTER.count_text(summarise(body, COUNTER)) <= max_tokens


def test_identifiers_in_order_of_appearance() -> None:
    assert identifiers("see README.md then fooBar and foo_bar, 42 and README.md") == [
        "README.md",
        "fooBar",
        "foo_bar",
        "42",
    ]


def test_header_overrides_defaults() -> None:
    script = parse_script({"text": "default", "token_delay": 0.5}, '{"text": "from header"}')
    assert script.text == "from header"
    assert script.token_delay == 0.5
    assert parse_script({}, '{"fault": 429}').fault == "429"


@pytest.mark.parametrize(
    "header", ["not json", "[1]", '{"colour": "red"}', '{"fault": "teapot"}', '{"tool": "Bash"}']
)
def test_bad_scripts_are_refused(header: str) -> None:
    with pytest.raises(ScriptError):
        parse_script({}, header)


READ_TOOL = {"name": "read_result", "input_schema": {"type": "object"}}


def offloaded(*extra: dict[str, Any]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Look at the logs."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": stub(REF_A)},
                {"type": "text", "text": "Also: " + stub(REF_B)},
            ],
        },
        *extra,
    ]
    return {"model": "m", "max_tokens": 100, "tools": [READ_TOOL], "messages": messages}


def test_read_result_reads_the_first_unread_ref() -> None:
    assert next_ref_to_read(read(offloaded())) == REF_A
    read_a = [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_r",
                    "name": "read_result",
                    "input": {"ref": REF_A},
                }
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_r", "content": "the rest"}],
        },
    ]
    # The last user message answers a read_result call: the model goes on, it reads no more.
    assert next_ref_to_read(read(offloaded(*read_a))) is None
    later = [*read_a, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and?"}]
    assert next_ref_to_read(read(offloaded(*later))) == REF_B


def test_read_result_needs_the_tool_and_a_stub() -> None:
    without_tool = offloaded()
    del without_tool["tools"]
    assert next_ref_to_read(read(without_tool)) is None
    no_stub = {
        "model": "m",
        "max_tokens": 100,
        "tools": [READ_TOOL],
        "messages": [{"role": "user", "content": 'read_result(ref="r_short")'}],
    }
    assert next_ref_to_read(read(no_stub)) is None


def test_read_result_answer_is_a_tool_call() -> None:
    script = parse_script({"read_result": True}, None)
    answer = plan_answer(offloaded(), script, "0" * 24 + "ab" * 20)
    assert answer["stop_reason"] == "tool_use"
    assert answer["content"] == [
        {
            "type": "tool_use",
            "id": "toolu_" + ("ab" * 12),
            "name": "read_result",
            "input": {"ref": REF_A, "start": 0, "length": 2000},
        }
    ]


def test_long_text_stops_at_max_tokens() -> None:
    script = parse_script({"text": "word " * 500, "tool": {"name": "Bash", "input": {}}}, None)
    body = {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "go"}]}
    answer = plan_answer(body, script, "0" * 64)
    assert answer["stop_reason"] == "max_tokens"
    assert [b["type"] for b in answer["content"]] == ["text"]
    assert COUNTER.count_text(answer["content"][0]["text"]) <= 20
