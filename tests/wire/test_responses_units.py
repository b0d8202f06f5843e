"""Responses items as the planner's units, on the requests Codex really sends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.core.errors import ContextTooLong
from proxy.core.history import GroupKind, group_history
from proxy.core.identity import conversation_of
from proxy.core.offload import Stub
from proxy.core.segments import stubbed as stubbed_message
from proxy.core.sse import SSEDecoder
from proxy.core.tokens import TokenCounter
from proxy.core.usage import LineKind, UsageMeter
from proxy.wire.responses import RESPONSES, asks_for_summary
from proxy.wire.responses_units import flatten, units_of

FIXTURES = Path(__file__).parents[1] / "fixtures" / "agent-requests"
CODEX = sorted(FIXTURES.glob("codex-*.json"))
COUNTER = RESPONSES.counter(TokenCounter())


def body_of(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())["body"]
    return body


def groups(body: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    units = RESPONSES.messages(body)
    shapes = [RESPONSES.message_shape(u, COUNTER.count_message(u)) for u in units]
    return [(g.kind.value, g.members) for g in group_history(shapes)]


@pytest.mark.parametrize("path", CODEX, ids=[p.stem for p in CODEX])
def test_units_give_back_the_very_items(path: Path) -> None:
    body = json.loads(path.read_text())["body"]
    units = RESPONSES.messages(body)
    assert orjson.dumps(flatten(units)) == orjson.dumps(body["input"])
    assert all(u["items"] for u in units)


def test_a_codex_turn_is_one_group_and_the_start_is_pinned() -> None:
    body = body_of("codex-turn6")
    units = RESPONSES.messages(body)
    assert [u["unit"] for u in units[:6]] == ["context"] * 4 + ["turn", "outputs"]
    # reasoning + function_call, then the output answering it
    assert [i["type"] for i in units[4]["items"]] == ["reasoning", "function_call"]
    found = groups(body)
    assert found[:4] == [("pinned", (0,)), ("pinned", (1,)), ("pinned", (2,)), ("pinned", (3,))]
    assert found[4] == ("pair", (4, 5))
    assert found[-1] == ("pinned", (12, 13)), "the turn in progress"


@pytest.mark.parametrize("name", ["codex-after-compaction", "codex-after-local-compaction"])
def test_after_codex_compacted_everything_is_pinned(name: str) -> None:
    # The instructions, the environment, the task and the compaction item or summary.
    assert {kind for kind, _ in groups(body_of(name))} == {GroupKind.PINNED.value}


def test_codex_compaction_requests_ask_for_a_summary() -> None:
    assert asks_for_summary(body_of("codex-compaction-request"))
    assert asks_for_summary(body_of("codex-local-compaction-request"))
    assert not asks_for_summary(body_of("codex-turn6"))
    trigger = RESPONSES.messages(body_of("codex-compaction-request"))[-1]
    assert trigger == {"unit": "item", "items": [{"type": "compaction_trigger"}]}


def test_parallel_calls_and_their_outputs_are_one_pair() -> None:
    items = [
        {"type": "message", "role": "user", "content": "go"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "a", "name": "x", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "x", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "1"},
        {"type": "function_call_output", "call_id": "b", "output": "2"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "k"}]},
        {"type": "message", "role": "user", "content": "again"},
    ]
    units = units_of(items)
    assert [u["unit"] for u in units] == ["context", "turn", "outputs", "turn", "message"]
    shapes = [RESPONSES.message_shape(u, 1) for u in units]
    assert shapes[1].calls == ("a", "b") and shapes[2].answers == ("a", "b")
    assert shapes[3].role == "assistant" and not shapes[3].calls


def test_an_orphan_output_is_malformed_and_a_server_search_is_model_output() -> None:
    items = [
        {"type": "message", "role": "user", "content": "go"},
        {"type": "function_call_output", "call_id": "ghost", "output": "?"},
        {"type": "tool_search_call", "call_id": "s1", "execution": "server", "arguments": {}},
        {"type": "tool_search_output", "call_id": "s1", "execution": "server", "tools": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "k"}]},
    ]
    units = units_of(items)
    assert [u["unit"] for u in units] == ["context", "outputs", "turn"]
    shapes = [RESPONSES.message_shape(u, 1) for u in units]
    kinds = [g.kind for g in group_history(shapes)]
    assert kinds[1] is GroupKind.MALFORMED
    assert len(units[2]["items"]) == 3


def test_a_stub_replaces_an_output_string_or_parts_and_keeps_its_fields() -> None:
    text = "line of the log\n" * 200
    unit = {
        "unit": "outputs",
        "items": [
            {"type": "function_call_output", "id": "fco_1", "call_id": "a", "output": text},
            {
                "type": "custom_tool_call_output",
                "call_id": "b",
                "output": [{"type": "input_text", "text": text}],
            },
        ],
    }
    results = RESPONSES.tool_results(unit)
    assert [result.block for result in results] == [0, 1]
    assert results[1].content == [{"type": "text", "text": text}]
    stubs = [Stub(0, "r_" + "a" * 16, 100), Stub(1, "r_" + "b" * 16, 100)]
    out = stubbed_message(RESPONSES, unit, stubs, "read_result", 4000)
    first, second = out["items"]
    assert first["id"] == "fco_1" and first["call_id"] == "a"
    assert first["output"].startswith("line of the log\n") and 'ref="r_aaaa' in first["output"]
    assert (
        second["output"][0]["type"] == "input_text" and 'ref="r_bbbb' in second["output"][0]["text"]
    )
    assert unit["items"][0]["output"] == text, "the client's item is not changed"


def test_the_conversation_is_keyed_by_prompt_cache_key() -> None:
    body = body_of("codex-turn6")
    after = body_of("codex-after-compaction")
    assert body["prompt_cache_key"] == after["prompt_cache_key"]
    one = conversation_of({}, RESPONSES.identity_view(body), "t1")
    two = conversation_of({}, RESPONSES.identity_view(after), "t1")
    assert one == two
    other = conversation_of({}, RESPONSES.identity_view({**body, "prompt_cache_key": "x"}), "t1")
    assert other != one


def test_usage_is_read_from_response_completed_and_whole_answers() -> None:
    usage = {
        "input_tokens": 1200,
        "input_tokens_details": {"cached_tokens": 1000},
        "output_tokens": 50,
        "total_tokens": 1250,
    }
    completed = {
        "type": "response.completed",
        "sequence_number": 9,
        "response": {"id": "resp_1", "output": [], "usage": usage},
    }
    delta = {"type": "response.output_text.delta", "sequence_number": 3, "delta": "Hello"}
    stream = b"".join(
        b"event: " + d["type"].encode() + b"\ndata: " + orjson.dumps(d) + b"\n\n"
        for d in (delta, completed)
    )
    meter = UsageMeter(RESPONSES)
    for cut in (7, 50, 200):
        meter = UsageMeter(RESPONSES)
        for n in range(0, len(stream), cut):
            meter.chunk(stream[n : n + cut])
        found = meter.total()
        assert (found.input_tokens, found.cache_read_input_tokens, found.output_tokens) == (
            200,
            1000,
            50,
        )
        assert meter.complete
    assert RESPONSES.body_usage({"usage": usage}) == found
    line = b"data: " + orjson.dumps(completed)
    assert RESPONSES.usage_line(line) == (LineKind.END, found)
    assert RESPONSES.text_chars(b"data: " + orjson.dumps(delta)) == 5


def test_errors_are_in_openais_shape_and_end_a_stream() -> None:
    error = ContextTooLong("nothing fits")
    body = orjson.loads(RESPONSES.error_body(error, "req_1"))
    assert body == {
        "error": {
            "message": "nothing fits",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    events = SSEDecoder().feed(RESPONSES.stream_error(error))
    assert [e.name for e in events] == ["error", "response.failed"]
    failed = orjson.loads(events[1].data)["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "context_length_exceeded"
