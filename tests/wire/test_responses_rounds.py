"""Merging read_result rounds into one Responses answer: streamed and whole agree.

Rounds are made by the stand-in's own answer builder (its events, ids, usage), fed to
ResponsesStreamMerger, and the client's stream is checked against what a Responses
client (the openai SDK, Codex) relies on, and against merge_responses of the same rounds.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.sse import SSEDecoder
from proxy.core.wire_format import MergeState
from proxy.testing.reply import Usage
from proxy.testing.responses_events import response_object, stream_events, usage_object
from proxy.wire.responses_rounds import (
    ResponsesStreamMerger,
    continue_units,
    held_tokens,
    merge_responses,
    split_response,
)
from proxy.wire.responses_units import flatten, units_of
from proxy.wire.responses_validation import validate_responses_request

TOOL = "read_result"
BODY = {"model": "gpt-test", "reasoning": {"effort": "low"}, "tools": []}


def reasoning(k: int) -> dict[str, Any]:
    return {"id": f"rs_{k:032x}", "type": "reasoning", "summary": [], "encrypted_content": "e"}


def text(k: int, words: str) -> dict[str, Any]:
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": words}
    return {
        "id": f"msg_{k:032x}",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [part],
    }


def call(k: int, name: str, arguments: dict[str, Any], n: int = 0) -> dict[str, Any]:
    return {
        "id": f"fc{n}_{k:032x}",
        "type": "function_call",
        "status": "completed",
        "arguments": orjson.dumps(arguments).decode(),
        "call_id": f"call_{k}_{n}_{name}",
        "name": name,
    }


def read(k: int, n: int = 0) -> dict[str, Any]:
    return call(k, TOOL, {"ref": "r_" + "0" * 16, "start": 100 * k}, n)


def usage(k: int, input_tokens: int) -> dict[str, Any]:
    return usage_object(Usage(input_tokens, input_tokens // 2, output=10 + k, reasoning=3))


def stream_of(k: int, items: list[dict[str, Any]], input_tokens: int) -> bytes:
    return b"".join(e.sse() for e in stream_events(whole_of(k, items, input_tokens), 2))


def whole_of(k: int, items: list[dict[str, Any]], input_tokens: int) -> dict[str, Any]:
    head = {"id": f"resp_{k:032x}", "model": "gpt-test"}
    return response_object(head, BODY, items, "completed", usage(k, input_tokens))


STOPPED = "[compaction-proxy: still reading when the limit of 4 read rounds was reached.]"


def stop_note(splits: list[Any]) -> str | None:
    """What the proxy's rounds say when the last round still wanted to read."""
    return STOPPED if splits and splits[-1].wants_reads_only else None


def merged_stream(rounds: list[list[dict[str, Any]]]) -> tuple[bytes, list[Any]]:
    """The client's bytes for these rounds, and each round as split by the merger."""
    merger = ResponsesStreamMerger(TOOL)
    out: list[bytes] = []
    splits = []
    for k, items in enumerate(rounds):
        merger.begin_round()
        decoder = SSEDecoder()
        for event in decoder.feed(stream_of(k, items, 1000 * (k + 1))):
            out.extend(merger.feed(event))
        assert merger.state is MergeState.STOPPED
        splits.append(merger.end_round())
    out.extend(merger.finish(stop_note(splits)))
    return b"".join(out), splits


def events_of(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    return [(e.name, orjson.loads(e.data)) for e in SSEDecoder().feed(raw)]


def check_client_stream(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The rules a Responses client relies on; returns the final response."""
    names = [name for name, _ in events]
    assert [data["type"] for _, data in events] == names
    assert names[0] == "response.created" and names.count("response.created") == 1
    assert names[-1] == "response.completed" and names.count("response.completed") == 1
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    added = [d for n, d in events if n == "response.output_item.added"]
    done = [d for n, d in events if n == "response.output_item.done"]
    assert [d["output_index"] for d in added] == list(range(len(added)))
    assert [d["output_index"] for d in done] == list(range(len(done)))
    final = events[-1][1]["response"]
    assert [d["item"] for d in done] == final["output"]
    for _, data in events:
        if "output_index" in data:
            assert data["output_index"] < len(added)
    created = events[0][1]["response"]
    assert final["id"] == created["id"]
    return final


def test_one_round_without_reads_is_relayed_byte_for_byte() -> None:
    items = [
        reasoning(0),
        text(0, "Running the tests now."),
        call(0, "exec_command", {"cmd": "ls"}),
    ]
    raw = stream_of(0, items, 1000)
    client, _ = merged_stream([items])
    assert client == raw


def test_reads_are_held_and_the_client_sees_one_response() -> None:
    rounds = [
        [reasoning(0), read(0)],  # reasoning that led only to a read: never shown
        [reasoning(1), text(1, "Reading more of the log."), read(1)],
        [reasoning(2), text(2, "Found it."), call(2, "exec_command", {"cmd": "make"})],
    ]
    client, splits = merged_stream(rounds)
    final = check_client_stream(events_of(client))
    shown = [i["id"] for i in final["output"]]
    assert shown == [
        rounds[1][0]["id"],
        rounds[1][1]["id"],
        rounds[2][0]["id"],
        rounds[2][1]["id"],
        rounds[2][2]["id"],
    ]
    assert TOOL.encode() not in client
    assert [len(s.reads) for s in splits] == [1, 1, 0]
    assert all(s.wants_reads_only for s in splits[:2]) and not splits[2].wants_reads_only
    # Usage: the last round's input, the output of the rounds that showed something.
    usage = final["usage"]
    assert usage["input_tokens"] == 3000 and usage["input_tokens_details"]["cached_tokens"] == 1500
    # (the read_result call of round 2 was not shown: its estimate is taken off)
    assert usage["output_tokens"] == (10 + 1) - held_tokens(rounds[1], TOOL) + (10 + 2)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    whole = merge_responses(
        [whole_of(k, items, 1000 * (k + 1)) for k, items in enumerate(rounds)], TOOL
    )
    assert whole["output"] == final["output"]
    assert whole["usage"] == final["usage"] and whole["id"] == final["id"]


def test_a_read_next_to_a_client_call_is_removed_and_the_rounds_stop() -> None:
    items = [
        reasoning(0),
        read(0, 0),
        call(0, "exec_command", {"cmd": "ls"}, 1),
    ]
    client, [split] = merged_stream([items])
    assert split.client_calls == 1 and not split.wants_reads_only
    final = check_client_stream(events_of(client))
    # The reasoning goes out with the call it also led to; the read does not.
    assert [i["type"] for i in final["output"]] == ["reasoning", "function_call"]
    assert final["output"][1]["name"] == "exec_command"
    whole = merge_responses([whole_of(0, items, 1000)], TOOL)
    assert whole["output"] == final["output"]


def test_rounds_that_end_while_reading_end_with_a_short_message() -> None:
    rounds = [[reasoning(0), read(0)], [reasoning(1), read(1)]]
    client, splits = merged_stream(rounds)
    assert splits[-1].wants_reads_only  # the proxy stopped: its round limit
    final = check_client_stream(events_of(client))
    assert final["status"] == "completed"
    [message] = final["output"]
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["content"][0]["text"] == STOPPED
    assert final["usage"]["output_tokens"] == 0  # the model showed the client nothing
    answers = [whole_of(k, items, 1000) for k, items in enumerate(rounds)]
    whole = merge_responses(answers, TOOL, STOPPED)
    assert whole["output"] == final["output"] and whole["status"] == "completed"


def test_continuing_a_round_gives_a_valid_request() -> None:
    tools = [
        {"type": "function", "name": "exec_command", "parameters": {}},
        {"type": "function", "name": TOOL, "parameters": {}},
    ]
    items = [
        {"type": "message", "role": "user", "content": "fix it"},
        reasoning(0),
        text(0, "Reading."),
        read(0),
    ]
    units = units_of([{"type": "message", "role": "developer", "content": "rules"}, items[0]])
    split = split_response(whole_of(0, items[1:], 100), TOOL)
    after = continue_units(units, split, [(split.reads[0].id, "[characters 0 to 4]\nabcd", False)])
    body = {"model": "gpt-test", "input": flatten(after), "tools": tools}
    assert validate_responses_request(body, openai=False) is None
    assert flatten(after)[-1] == {
        "type": "function_call_output",
        "call_id": split.reads[0].id,
        "output": "[characters 0 to 4]\nabcd",
    }


@st.composite
def round_lists(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    rounds = []
    for k in range(draw(st.integers(0, 3))):
        items = [reasoning(k)] if draw(st.booleans()) else []
        if draw(st.booleans()):
            items.append(text(k, "Reading the rest of it."))
        items.append(read(k))
        rounds.append(items)
    k = len(rounds)
    last = [reasoning(k)] if draw(st.booleans()) else []
    if draw(st.booleans()):
        last.append(text(k, "Here is the answer."))
    for n in range(draw(st.integers(0, 2))):
        last.append(call(k, "exec_command", {"cmd": f"ls {n}"}, n))
    if draw(st.booleans()) and rounds:
        last.insert(len(last) // 2, read(k, 9))
    if all(item["type"] == "reasoning" for item in last):
        last.append(text(k, "Done."))
    rounds.append(last)
    return rounds


@settings(max_examples=300, deadline=None)
@given(round_lists())
def test_streamed_and_whole_merges_agree(rounds: list[list[dict[str, Any]]]) -> None:
    client, splits = merged_stream(rounds)
    final = check_client_stream(events_of(client))
    output = final["output"]
    assert output, "never an empty answer"
    assert all(i.get("name") != TOOL for i in output)
    for n, item in enumerate(output):
        if item["type"] == "reasoning":  # shown only with the item it led to
            assert n + 1 < len(output) and output[n + 1]["id"][-32:] == item["id"][-32:]
    answers = [whole_of(k, items, 1000 * (k + 1)) for k, items in enumerate(rounds)]
    whole = merge_responses(answers, TOOL, stop_note(splits))
    assert whole["output"] == output
    assert whole["usage"] == final["usage"]
    assert final["usage"]["input_tokens"] == 1000 * len(rounds)
