"""Scenarios: the stand-in scripts an agent that cannot send headers, from its history."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.tokens import TokenCounter
from proxy.testing import scenario as scripted
from proxy.testing.api_messages import content, message, read
from proxy.testing.reply import Reply, Usage
from proxy.testing.scenario import (
    CLEARED,
    COMPACTION,
    COMPACTION_PROMPTS,
    CONTINUATION,
    READ,
    SIDE,
    TEXT,
    TOOL,
    Scenario,
    Step,
    scenario_reply,
)
from proxy.testing.standin import StandInOptions
from proxy.testing.tap import Exchange, sse_events, told_usage
from tests.plugins.standin import RunningStandIn

COUNTER = TokenCounter()


@dataclass(frozen=True)
class Answered:
    content: list[dict[str, Any]]
    stop_reason: str


def scenario_answer(
    scenario: Scenario, body: dict[str, Any], counter: TokenCounter, request_hash: str
) -> tuple[str, Answered]:
    """The scenario's answer to a Messages body, as the stand-in renders it."""
    reply = scenario_reply(scenario, read(body), counter, "0" * 24 + request_hash)
    whole = message(body["model"], reply, Usage(1))
    return reply.kind, Answered(whole["content"], whole["stop_reason"])


def choose(scenario: Scenario, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The scenario's choice for a Messages body, as content blocks (ids unfinished)."""
    choice = scripted.choose(scenario, read(body))
    return choice.kind, content(Reply("0" * 64, choice.text, choice.calls))


def continues_after_compaction(body: dict[str, Any]) -> bool:
    return scripted.continues_after_compaction(read(body))


def cleared_results(body: dict[str, Any]) -> int:
    return scripted.cleared_results(read(body))


BASH = {"name": "Bash", "input_schema": {"type": "object"}}
READ_TOOL = {"name": "read_result", "input_schema": {"type": "object"}}


def stub(ref: str) -> str:
    return f'head...\n[offloaded. Call read_result(ref="{ref}", start=10, length=2000)]'


def call(n: int) -> dict[str, Any]:
    return {"name": "Bash", "input": {"command": f"cat logs/{n}.log"}}


def body(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 1000, "tools": tools, "messages": messages}


def answer_all(blocks: list[dict[str, Any]], texts: dict[str, str]) -> dict[str, Any]:
    """The user message answering every tool call of `blocks` (text by tool name)."""
    results = [
        {"type": "tool_result", "tool_use_id": b["id"], "content": texts[b["name"]]}
        for b in blocks
        if b["type"] == "tool_use"
    ]
    return {"role": "user", "content": results}


def run_session(
    scenario: Scenario, *, offer_read: bool, limit: int = 200
) -> list[tuple[str, list[dict[str, Any]]]]:
    """Follow the scenario as an agent and a proxy would (stubs in every client result
    once `offer_read`), until it answers with text."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Go."}]
    tools = [BASH, READ_TOOL] if offer_read else [BASH]
    texts = {"Bash": stub("r_00000000000000aa"), "read_result": "slice"}
    seen = []
    for n in range(limit):
        kind, answer = scenario_answer(scenario, body(messages, tools), COUNTER, f"{n:032x}")
        seen.append((kind, answer.content))
        if answer.stop_reason != "tool_use":
            return seen
        messages.append({"role": "assistant", "content": answer.content})
        messages.append(answer_all(answer.content, texts))
    raise AssertionError("the scenario never ended")


scenarios = st.builds(
    lambda shapes: Scenario(
        (
            *(Step(calls=tuple(call(k) for k in range(c)), reads=r) for c, r in shapes),
            Step(text="Done."),
        )
    ),
    st.lists(st.tuples(st.integers(1, 3), st.integers(0, 3)), max_size=8),
)


@settings(max_examples=60, deadline=None)  # counting tokens: slow first call
@given(scenarios, st.booleans())
def test_a_session_goes_through_every_step_in_order(scenario: Scenario, offer: bool) -> None:
    seen = run_session(scenario, offer_read=offer)
    expected: list[tuple[str, int]] = []
    for n, step in enumerate(scenario.steps[:-1]):
        # Reads need a stub to read: there is none before the first tool result.
        reads = step.reads if offer and n > 0 else 0
        expected += [(READ, 1)] * reads + [(TOOL, len(step.calls))]
    expected.append((TEXT, 0))
    got = [(kind, sum(b["type"] == "tool_use" for b in blocks)) for kind, blocks in seen]
    assert got == expected
    assert seen[-1][1] == [{"type": "text", "text": "Done."}]


def test_step_ids_and_reads_of_the_newest_stubs_first() -> None:
    scenario = Scenario((Step(calls=(call(0), call(1)), reads=2), Step(text="Done.")))
    history = [
        {"role": "user", "content": f"{stub('r_1111111111111111')}\n{stub('r_2222222222222222')}"}
    ]
    kind, blocks = choose(scenario, body(history, [BASH, READ_TOOL]))
    assert kind == READ
    assert blocks[0]["input"] == {"ref": "r_2222222222222222", "start": 0, "length": 2000}
    history += [
        {"role": "assistant", "content": [{**blocks[0], "id": "toolu_step000_r1"}]},
        answer_all([{**blocks[0], "id": "toolu_step000_r1"}], {"read_result": "slice"}),
    ]
    kind, blocks = choose(scenario, body(history, [BASH, READ_TOOL]))
    assert (kind, blocks[0]["input"]["ref"]) == (READ, "r_1111111111111111")
    history += [
        {"role": "assistant", "content": [{**blocks[0], "id": "toolu_step000_r2"}]},
        answer_all([{**blocks[0], "id": "toolu_step000_r2"}], {"read_result": "slice"}),
    ]
    kind, blocks = choose(scenario, body(history, [BASH, READ_TOOL]))
    assert kind == TOOL
    assert [b["id"] for b in blocks] == ["toolu_step000_0", "toolu_step000_1"]


def test_side_requests_and_the_agents_own_compaction() -> None:
    scenario = Scenario((Step(calls=(call(0),)), Step(calls=(call(1),)), Step(text="Done.")))
    assert choose(scenario, body([{"role": "user", "content": "a title?"}], []))[0] == SIDE
    schema = {"type": "object", "properties": {"title": {"type": "string"}, "n": {}}}
    titled = body([{"role": "user", "content": "a title?"}], [])
    titled["output_config"] = {
        "format": {"type": "json_schema", "schema": {**schema, "required": ["title"]}}
    }
    assert choose(scenario, titled) == (SIDE, [{"type": "text", "text": '{"title":"OK."}'}])
    done_0 = [
        {"role": "user", "content": "Go."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_step000_0x", **call(0)}],
        },
        answer_all([{"type": "tool_use", "id": "toolu_step000_0x", **call(0)}], {"Bash": "out"}),
    ]
    asked = [*done_0, {"role": "user", "content": COMPACTION_PROMPTS[0] + " ..."}]
    kind, blocks = choose(scenario, body(asked, [BASH]))
    assert kind == COMPACTION
    # The agent starts over from the summary: the scenario goes on after step 0.
    resumed = [{"role": "user", "content": f"{CONTINUATION}. {blocks[0]['text']}"}]
    assert continues_after_compaction(body(resumed, [BASH]))
    kind, blocks = choose(scenario, body(resumed, [BASH]))
    assert (kind, blocks[-1]["id"]) == (TOOL, "toolu_step001_0")
    assert not continues_after_compaction(body(done_0, [BASH]))


def test_cleared_results_are_counted() -> None:
    cleared = {"type": "tool_result", "tool_use_id": "t", "content": CLEARED}
    history = [{"role": "user", "content": [cleared, {**cleared, "content": "kept"}]}]
    assert cleared_results(body(history, [])) == 1


async def test_the_stand_in_answers_and_records_by_the_scenario(
    make_standin: Any,
) -> None:
    scenario = Scenario((Step(calls=(call(0),), text="Looking."), Step(text="Done.")))
    standin: RunningStandIn = await make_standin(StandInOptions(scenario=scenario))
    request = body([{"role": "user", "content": "Go."}], [BASH])
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{standin.url}/v1/messages", json=request, headers=headers) as r:
            first = await r.json()
        scripted = {**headers, "x-stand-in": '{"text": "Scripted."}'}
        async with http.post(f"{standin.url}/v1/messages", json=request, headers=scripted) as r:
            second = await r.json()
    assert first["stop_reason"] == "tool_use"
    assert first["content"][0] == {"type": "text", "text": "Looking."}
    assert first["content"][1]["id"].startswith("toolu_step000_0")
    assert second["content"] == [{"type": "text", "text": "Scripted."}]  # the header wins
    recorded = standin.recorded
    assert [(r.kind, r.status) for r in recorded] == [(TOOL, 200), ("", 200)]
    assert recorded[0].content == first["content"]
    assert recorded[0].usage["input_tokens"] == first["usage"]["input_tokens"]


def test_told_usage_of_a_stream_and_of_a_body() -> None:
    start = {"message": {"usage": {"input_tokens": 5, "cache_read_input_tokens": 100}}}
    delta = {"usage": {"input_tokens": 7, "output_tokens": 3}}
    stream = (
        b"event: message_start\ndata: " + orjson.dumps(start) + b"\n\n"
        b"event: ping\ndata: {}\n\n"
        b"event: message_delta\r\ndata: " + orjson.dumps(delta) + b"\r\n\r\n"
        b"event: message_stop\ndata: {"  # unfinished: clients drop it
    )
    sse = {"Content-Type": "text/event-stream; charset=utf-8"}
    told = told_usage(Exchange("POST", "/v1/messages", {}, b"", 200, sse, stream, True))
    assert told == {"input_tokens": 7, "cache_read_input_tokens": 100, "output_tokens": 3}
    assert [name for name, _ in sse_events(stream)] == ["message_start", "ping", "message_delta"]
    whole = orjson.dumps({"usage": {"input_tokens": 9}})
    json_head = {"Content-Type": "application/json"}
    assert told_usage(Exchange("POST", "/", {}, b"", 200, json_head, whole, True)) == {
        "input_tokens": 9
    }
    assert told_usage(Exchange("POST", "/", {}, b"", 400, json_head, whole, True)) is None
