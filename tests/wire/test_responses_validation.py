"""The stand-in's Responses validation: OpenAI's rules and wordings, on plain bodies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.wire.common import OpenAIInvalid
from proxy.wire.responses_validation import validate_responses_request, window_error

EXEC = {"type": "function", "name": "exec_command", "parameters": {"type": "object"}}
PATCH = {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}}


def user(text: str = "go") -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def call(call_id: str, name: str = "exec_command", **extra: Any) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": "{}", **extra}


def output(call_id: str, **extra: Any) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "ok", **extra}


def custom_call(call_id: str) -> dict[str, Any]:
    return {"type": "custom_tool_call", "call_id": call_id, "name": "apply_patch", "input": "x"}


def custom_output(call_id: str) -> dict[str, Any]:
    return {"type": "custom_tool_call_output", "call_id": call_id, "output": "done"}


def body(items: list[Any], tools: list[Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-test", "input": items, "tools": [EXEC, PATCH] if tools is None else tools,
            **extra}  # fmt: skip


REFUSED: list[tuple[str, dict[str, Any], bool, str, str | None, str | None]] = [
    # (case, body, plays_openai, wording, param, code)
    ("output without its call", body([user(), output("c1")]), False,
     "No tool call found for function call output with call_id c1.", "input", None),
    ("custom output without its call", body([user(), custom_output("c1")]), False,
     "No tool call found for custom tool call output with call_id c1.", "input", None),
    ("output of a custom call as a function output", body([custom_call("c1"), output("c1")]),
     False, "No tool call found for function call output with call_id c1.", "input", None),
    ("output before its call", body([output("c1"), call("c1")]), False,
     "No tool call found for function call output with call_id c1.", "input", None),
    ("call without its output", body([user(), call("c1"), user("next")]), False,
     "No tool output found for function call c1.", "input", None),
    ("custom call without its output", body([user(), custom_call("c9")]), False,
     "No tool output found for custom tool call c9.", "input", None),
    ("duplicated item id", body([user(), {**user(), "id": "msg_1"}, {**user(), "id": "msg_1"}]),
     False, "Duplicate item found with id msg_1. Remove duplicate items", "input", None),
    ("duplicated call id", body([call("c1"), output("c1"), call("c1"), output("c1")]), False,
     "Duplicate call_id c1", "input", None),
    ("two outputs for one call", body([call("c1"), output("c1"), output("c1")]), False,
     "Duplicate output for call_id c1", "input", None),
    ("a call to a tool not offered", body([call("c1", "read_result"), output("c1")]), False,
     "'read_result' is not the name of a function tool", "input[0].name", "invalid_value"),
    ("a custom call named like a function tool",
     body([{**custom_call("c1"), "name": "exec_command"}, custom_output("c1")]), False,
     "'exec_command' is not the name of a custom tool", "input[0].name", "invalid_value"),
    ("compaction_trigger at another server", body([user(), {"type": "compaction_trigger"}]),
     False, "Invalid value: 'compaction_trigger'. Supported values are:", "input[1].type",
     "invalid_value"),
    ("compaction item at another server",
     body([user(), {"type": "compaction", "encrypted_content": "x"}]), False,
     "Invalid value: 'compaction'.", "input[1].type", "invalid_value"),
    ("compaction_trigger not last", body([{"type": "compaction_trigger"}, user()]), True,
     "'compaction_trigger' must be the last input item.", "input[0]", None),
    ("compaction without its content", body([{"type": "compaction"}, user()]), True,
     "Missing required parameter: 'input[0].encrypted_content'.",
     "input[0].encrypted_content", "missing_required_parameter"),
    ("an unknown item type", body([{"type": "thought", "text": "x"}]), False,
     "Invalid value: 'thought'.", "input[0].type", "invalid_value"),
    ("an unknown role", body([{"type": "message", "role": "robot", "content": "x"}]), False,
     "Invalid value: 'robot'. Supported values are: 'user', 'assistant', 'system', and"
     " 'developer'.", "input[0].role", "invalid_value"),
    ("an unknown tool type", body([user()], [{"type": "teleport"}]), False,
     "Invalid value: 'teleport'.", "tools[0].type", "invalid_value"),
    ("a duplicated tool name", body([user()], [EXEC, EXEC]), False,
     "Duplicate tool name: 'exec_command'.", "tools[1].name", None),
    ("an empty call_id", body([call(""), output("")]), False,
     "Invalid 'input[0].call_id': empty string.", "input[0].call_id", "empty_string"),
    ("a call without arguments", body([{**call("c1"), "arguments": None}, output("c1")]), False,
     "Missing required parameter: 'input[0].arguments'.", "input[0].arguments",
     "missing_required_parameter"),
    ("previous_response_id", body([user()], previous_response_id="resp_1"), False,
     "Previous response with id 'resp_1' not found.", "previous_response_id",
     "previous_response_not_found"),
    ("no model", {"input": "hi"}, False, "Missing required parameter: 'model'.", "model",
     "missing_required_parameter"),
    ("no input", {"model": "gpt-test"}, False, "Missing required parameter: 'input'.", "input",
     "missing_required_parameter"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "request_body", "plays_openai", "wording", "param", "code"),
    REFUSED,
    ids=[r[0] for r in REFUSED],
)
def test_refused_in_openai_wording(
    case: str,
    request_body: dict[str, Any],
    plays_openai: bool,
    wording: str,
    param: str | None,
    code: str | None,
) -> None:
    error = validate_responses_request(request_body, openai=plays_openai)
    assert error is not None, case
    assert wording in error.message
    assert (error.param, error.code) == (param, code)


NAMESPACE = {"type": "namespace", "name": "mcp",
             "tools": [{"type": "function", "name": "mcp_read"}]}  # fmt: skip
SEARCHED = {"type": "tool_search_output", "call_id": "s",
            "tools": [{"type": "function", "name": "found"}]}  # fmt: skip
ACCEPTED: list[tuple[str, dict[str, Any], bool]] = [
    ("a string input", {"model": "gpt-test", "input": "hi"}, False),
    ("a message without a type", body([{"role": "user", "content": "hi"}]), False),
    ("calls and outputs, parallel", body([user(), call("a"), call("b"), output("b"), output("a")]),
     False),
    ("a custom call and its output", body([user(), custom_call("p"), custom_output("p")]), False),
    ("unknown fields on known items", body([{**call("a"), "internal_x": {"t": 1}}, output("a")]),
     False),
    ("history calls with tools: [] (Codex's handoff request)",
     body([user(), call("a", "anything"), output("a"), user("summarise")], []), False),
    ("a function a namespace offers",
     body([call("a", "mcp_read"), output("a")], [NAMESPACE]), False),
    ("a function a tool_search brought in",
     body([SEARCHED, call("a", "found"), output("a")]), False),
    ("compaction_trigger last at OpenAI", body([user(), {"type": "compaction_trigger"}]), True),
    ("a compaction item at OpenAI",
     body([{"type": "compaction", "encrypted_content": "x"}, user()]), True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "request_body", "plays_openai"), ACCEPTED, ids=[a[0] for a in ACCEPTED]
)
def test_accepted(case: str, request_body: dict[str, Any], plays_openai: bool) -> None:
    assert validate_responses_request(request_body, openai=plays_openai) is None, case


def test_the_real_codex_requests_pass_and_only_openai_knows_compaction(fixtures_dir: Path) -> None:
    compaction = {"codex-compaction-request.json": 22, "codex-after-compaction.json": 4}
    files = sorted(fixtures_dir.glob("agent-requests/codex-*.json"))
    assert len(files) == 6
    for path in files:
        request = orjson.loads(path.read_bytes())["body"]
        assert validate_responses_request(request, openai=True) is None, path.name
        error = validate_responses_request(request, openai=False)
        if path.name in compaction:
            assert error is not None
            assert error.param == f"input[{compaction[path.name]}].type"
        else:
            assert error is None, path.name


def test_window_wording_is_openais() -> None:
    assert window_error(40_000, 40_000) is None
    error = window_error(40_001, 40_000)
    assert error == OpenAIInvalid(
        "Your input exceeds the context window of this model. Please adjust your input and"
        " try again.",
        "input",
        "context_length_exceeded",
    )


# -- pairing, as a property ---------------------------------------------------------------

ITEMS = st.lists(
    st.tuples(st.sampled_from(["call", "output", "custom", "custom_output", "user"]),
              st.sampled_from(["a", "b", "c"])),
    max_size=8,
)  # fmt: skip
BUILD = {"call": call, "output": output, "custom": custom_call, "custom_output": custom_output}


def _acceptable(steps: list[tuple[str, str]]) -> bool:
    """The rules, restated: a call id is used by one call; an output follows a call of its
    kind with that id and is its only one; every call has its output."""
    calls: dict[str, str] = {}
    answered: set[str] = set()
    for kind, call_id in steps:
        if kind in ("call", "custom"):
            if call_id in calls:
                return False
            calls[call_id] = kind
        elif kind in ("output", "custom_output"):
            wanted = "call" if kind == "output" else "custom"
            if calls.get(call_id) != wanted or call_id in answered:
                return False
            answered.add(call_id)
    return answered == set(calls)


@given(ITEMS)
def test_pairing_is_accepted_exactly_when_every_call_has_its_one_output(
    steps: list[tuple[str, str]],
) -> None:
    items = [user() if kind == "user" else BUILD[kind](call_id) for kind, call_id in steps]
    error = validate_responses_request(body(items), openai=False)
    assert (error is None) == _acceptable(steps), error


def test_a_standin_reasoning_item_needs_the_item_it_led_to() -> None:
    digest = "a" * 32
    reasoning = {"id": f"rs_{digest}", "type": "reasoning", "summary": []}
    call = {
        "id": f"fc_{digest}",
        "type": "function_call",
        "call_id": "c1",
        "name": "exec_command",
        "arguments": "{}",
    }
    output = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    user = {"type": "message", "role": "user", "content": "go"}
    assert (
        validate_responses_request(
            {"model": "m", "input": [user, reasoning, call, output]}, openai=False
        )
        is None
    )
    for items in ([user, reasoning], [user, reasoning, user]):
        error = validate_responses_request({"model": "m", "input": items}, openai=False)
        assert error is not None
        assert error.message == (
            f"Item 'rs_{digest}' of type 'reasoning' was provided without its required"
            " following item."
        )
    # Reasoning the stand-in did not make (Codex's recorded ids) is not checked.
    foreign = {**reasoning, "id": "rs_0002a45a7f078a7a4438b4b4"}
    assert (
        validate_responses_request({"model": "m", "input": [user, foreign]}, openai=False) is None
    )
