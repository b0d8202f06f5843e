"""The Gemini API's request rules (proxy/wire/gemini_validation.py), one by one, each with the
level that says who acts on it."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.wire.gemini_validation import (
    Level,
    check_request,
    current_turn,
    history_violation,
    structure_violation,
)

MODEL = "gemini-3-flash-preview"


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "parts": list(parts)}


def model(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "model", "parts": list(parts)}


def call(name: str = "ls", signature: str | None = "c2ln") -> dict[str, Any]:
    part: dict[str, Any] = {"functionCall": {"name": name, "args": {}}}
    if signature:
        part["thoughtSignature"] = signature
    return part


def answer(name: str = "ls") -> dict[str, Any]:
    return {"functionResponse": {"name": name, "response": {"output": "x"}}}


TEXT = {"text": "hi"}
VALID = [user(TEXT), model(call(), call("cat", None)), user(answer(), answer("cat")), model(TEXT)]


def found(body: dict[str, Any], name: str = MODEL) -> tuple[Level, str, str] | None:
    violation = check_request(body, name)
    return None if violation is None else (violation.level, violation.field, violation.message)


def test_a_valid_history_passes_in_either_spelling() -> None:
    assert found({"contents": VALID, "tools": [{"functionDeclarations": [{"name": "ls"}]}]}) is None
    snake = {
        "contents": [
            {"role": "user", "parts": [{"inline_data": {"mime_type": "image/png", "data": ""}}]}
        ],
        "system_instruction": {"parts": [TEXT]},
        "generation_config": {"max_output_tokens": 10},
    }
    assert found(snake) is None
    assert found({"contents": [user(TEXT), user(TEXT)]}) is None, "two user turns: the router's"


@pytest.mark.parametrize(
    ("contents", "field", "words"),
    [
        ([model(call())], "contents[0]", "function call turn comes immediately after a user turn"),
        ([user(TEXT), model(TEXT), model(call())], "contents[2]", "after a user turn"),
        ([user(TEXT), model(TEXT), user(answer())], "contents[2]", "function response turn comes"),
        (
            [user(TEXT), model(call(), call()), user(answer())],
            "contents[2]",
            "number of function response parts",
        ),
        ([user(TEXT), model(call())], "contents[2]", "number of function response parts"),
        (
            [user(TEXT), model(call()), user(TEXT)],
            "contents[2]",
            "number of function response parts",
        ),
        ([user(TEXT), {"role": "model", "parts": []}], "contents[1].parts", "must not be empty"),
        ([user({"text": ""})], "contents[0].parts[0].data", "required oneof field 'data'"),
        ([user({"thought": True})], "contents[0].parts[0].data", "required oneof field 'data'"),
        ([user({"text": "a", "inlineData": {}})], "contents[0].parts[0].inlineData", "already set"),
        ([{"role": "system", "parts": [TEXT]}], "contents[0].role", "valid role"),
        ([], "contents", "contents is not specified"),
    ],
)
def test_history_rules(contents: list[Any], field: str, words: str) -> None:
    got = found({"contents": contents})
    assert got is not None and got[0] is Level.HISTORY
    assert got[1] == field and words in got[2]


def test_gemini_3_wants_the_signature_on_the_current_turns_first_call_only() -> None:
    unsigned = [user(TEXT), model(call(signature=None)), user(answer())]
    got = found({"contents": unsigned})
    assert (
        got is not None
        and "missing a thought_signature" in got[2]
        and got[1] == "contents[1].parts"
    )
    assert "`default_api:ls`, position 2" in got[2]
    assert found({"contents": unsigned}, "gemini-2.5-flash") is None, "2.5 does not check"
    earlier = [*unsigned, model(TEXT), user(TEXT), model(call()), user(answer())]
    assert current_turn(earlier) == 5 and found({"contents": earlier}) is None
    skipped = [
        user(TEXT),
        model(call(signature="skip_thought_signature_validator")),
        user(answer()),
    ]
    assert found({"contents": skipped}) is None


def test_structure_is_what_the_proxy_refuses_itself() -> None:
    assert structure_violation([]) is not None
    for body, field in [
        ({"contents": "hello"}, "contents"),
        ({"contents": [5]}, "contents[0]"),
        ({"contents": [{"parts": {"text": "x"}}]}, "contents[0].parts"),
        ({"contents": [{"parts": ["x"]}]}, "contents[0].parts[0]"),
        ({"contents": [], "generationConfig": 3}, "generation_config"),
        ({"contents": [], "tools": {"functionDeclarations": []}}, "tools"),
    ]:
        violation = structure_violation(body)
        assert violation is not None and violation.level is Level.STRUCTURE, body
        assert violation.field == field
    assert history_violation({"contents": VALID}, MODEL) is None


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"contents": VALID, "stream": True}, 'Unknown name "stream"'),
        (
            {"contents": [user({"text": "a", "cache_control": {}})]},
            "Unknown name \"cache_control\" at 'contents[0].parts[0]'",
        ),
        (
            {
                "contents": VALID,
                "tools": [{"functionDeclarations": [{"name": "ls"}, {"name": "ls"}]}],
            },
            "Duplicate function declaration found: ls",
        ),
        (
            {"contents": VALID, "tools": [{"functionDeclarations": [{"name": "9ls"}]}]},
            "Invalid function name",
        ),
        (
            {
                "contents": VALID,
                "tools": [
                    {
                        "functionDeclarations": [
                            {"name": "a", "parameters": {}, "parametersJsonSchema": {}}
                        ]
                    }
                ],
            },
            "cannot both be set",
        ),
        (
            {
                "contents": VALID,
                "tools": [{"functionDeclarations": [{"name": "a"}]}],
                "generationConfig": {"responseMimeType": "application/json"},
            },
            "Function calling with a response mime type",
        ),
        (
            {
                "contents": VALID,
                "cachedContent": "cachedContents/1",
                "systemInstruction": {"parts": [TEXT]},
            },
            "CachedContent can not be used",
        ),
        ({"contents": VALID, "generationConfig": {"maxOutputTokens": 0}}, "max_output_tokens"),
    ],
)
def test_strict_rules_only_the_api_holds(body: dict[str, Any], words: str) -> None:
    got = found(body)
    assert got is not None and got[0] is Level.STRICT and words in got[2]
