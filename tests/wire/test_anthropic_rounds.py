"""Merging read_result rounds into one client message."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.core.sse import Event, SSEDecoder, encode_event
from proxy.core.usage import call_tokens
from proxy.wire.anthropic_rounds import (
    StreamMerger,
    continue_messages,
    merge_messages,
    split_message,
)

TOOL = "read_result"


def ev(name: str, data: dict[str, Any]) -> Event:
    raw = encode_event(name, orjson.dumps(data))
    return Event(name, orjson.dumps(data).decode(), raw)


def round_events(
    blocks: list[dict[str, Any]], stop: str, usage_in: int, usage_out: int
) -> list[Event]:
    events = [
        ev(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "m",
                    "content": [],
                    "stop_reason": None,
                    "usage": {
                        "input_tokens": usage_in,
                        "output_tokens": 1,
                        "cache_read_input_tokens": 10,
                    },
                },
            },
        ),
        ev("ping", {"type": "ping"}),
    ]
    for i, block in enumerate(blocks):
        if block["type"] == "text":
            events.append(
                ev(
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": i,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
            )
            events.append(
                ev(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": i,
                        "delta": {"type": "text_delta", "text": block["text"]},
                    },
                )
            )
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            events.append(
                ev(
                    "content_block_start",
                    {"type": "content_block_start", "index": i, "content_block": start},
                )
            )
            js = orjson.dumps(block["input"]).decode()
            for piece in (js[: len(js) // 2], js[len(js) // 2 :]):
                events.append(
                    ev(
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": i,
                            "delta": {"type": "input_json_delta", "partial_json": piece},
                        },
                    )
                )
        events.append(ev("content_block_stop", {"type": "content_block_stop", "index": i}))
    events.append(
        ev(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": usage_out},
            },
        )
    )
    events.append(ev("message_stop", {"type": "message_stop"}))
    return events


def client_events(chunks: list[bytes]) -> list[tuple[str, dict[str, Any]]]:
    return [(e.name, orjson.loads(e.data)) for e in SSEDecoder().feed(b"".join(chunks))]


def test_one_round_with_nothing_held_is_byte_identical() -> None:
    events = round_events([{"type": "text", "text": "hello"}], "end_turn", 100, 7)
    merger = StreamMerger(TOOL)
    merger.begin_round()
    out = [b for e in events for b in merger.feed(e)]
    round_ = merger.end_round()
    out += merger.finish()
    assert b"".join(out) == b"".join(e.raw for e in events)
    assert not round_.wants_reads_only and round_.assistant["content"] == [
        {"type": "text", "text": "hello"}
    ]


def test_read_result_is_held_and_the_next_round_continues_the_message() -> None:
    merger = StreamMerger(TOOL)
    merger.begin_round()
    first = round_events(
        [
            {"type": "text", "text": "Let me look."},
            {
                "type": "tool_use",
                "id": "toolu_r1",
                "name": TOOL,
                "input": {"ref": "r_00", "start": 0},
            },
        ],
        "tool_use",
        100,
        20,
    )
    out = [b for e in first for b in merger.feed(e)]
    round1 = merger.end_round()
    assert round1.wants_reads_only
    assert round1.reads[0].input == {"ref": "r_00", "start": 0}
    merger.begin_round()
    second = round_events(
        [
            {"type": "text", "text": "Found it."},
            {"type": "tool_use", "id": "toolu_c1", "name": "Bash", "input": {"command": "ls"}},
        ],
        "tool_use",
        300,
        30,
    )
    out += [b for e in second for b in merger.feed(e)]
    round2 = merger.end_round()
    assert round2.client_calls == 1 and not round2.wants_reads_only
    out += merger.finish()

    seen = client_events(out)
    names = [n for n, _ in seen]
    assert names.count("message_start") == 1 and names.count("message_stop") == 1
    assert all(
        d["content_block"]["name"] != TOOL
        for n, d in seen
        if n == "content_block_start" and d["content_block"]["type"] == "tool_use"
    )
    starts = [d["index"] for n, d in seen if n == "content_block_start"]
    assert starts == [0, 1, 2], "indices continue across rounds without gaps"
    (delta,) = [d for n, d in seen if n == "message_delta"]
    assert delta["delta"]["stop_reason"] == "tool_use"
    # The client is told the last round's input (what the model saw last) and the output
    # it received: both rounds' less the held read_result call's (an estimate).
    held = call_tokens(len(orjson.dumps({"ref": "r_00", "start": 0})))
    assert delta["usage"] == {
        "input_tokens": 300,
        "cache_read_input_tokens": 10,
        "output_tokens": 50 - held,
    }


def test_rounds_that_end_on_a_held_call_end_the_turn() -> None:
    merger = StreamMerger(TOOL)
    merger.begin_round()
    events = round_events(
        [{"type": "tool_use", "id": "t", "name": TOOL, "input": {"ref": "r"}}], "tool_use", 10, 5
    )
    out = [b for e in events for b in merger.feed(e)]
    merger.end_round()
    out += merger.finish()
    seen = client_events(out)
    assert [n for n, _ in seen] == ["message_start", "ping", "message_delta", "message_stop"]
    assert seen[2][1]["delta"]["stop_reason"] == "end_turn"


def test_unknown_events_and_errors_pass_through() -> None:
    merger = StreamMerger(TOOL)
    merger.begin_round()
    odd = ev("brand_new_event", {"type": "brand_new_event", "x": 1})
    err = ev("error", {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    assert merger.feed(odd) == [odd.raw]
    assert merger.feed(err) == [err.raw]


def test_non_streaming_rounds_merge_into_one_message() -> None:
    first = {
        "id": "msg_a",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [
            {"type": "text", "text": "Reading."},
            {"type": "tool_use", "id": "r1", "name": TOOL, "input": {"ref": "r_1"}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 100, "output_tokens": 10},
    }
    round1 = split_message(first, TOOL)
    assert round1.wants_reads_only
    second = {
        **first,
        "id": "msg_b",
        "content": [{"type": "text", "text": "Done."}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 150, "output_tokens": 5},
    }
    merged = merge_messages([first, second], TOOL)
    assert merged["id"] == "msg_a"
    assert merged["content"] == [
        {"type": "text", "text": "Reading."},
        {"type": "text", "text": "Done."},
    ]
    assert merged["stop_reason"] == "end_turn"
    held = call_tokens(len(orjson.dumps({"ref": "r_1"})))
    assert merged["usage"] == {"input_tokens": 150, "output_tokens": 15 - held}
    messages = continue_messages(
        [{"role": "user", "content": "q"}], round1, [("r1", "text", False)]
    )
    assert messages[1] == {"role": "assistant", "content": first["content"]}
    assert messages[2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "r1",
        "content": "text",
        "is_error": False,
    }


def test_a_mixed_answer_hides_the_read_call_and_keeps_the_client_call() -> None:
    message = {
        "id": "m",
        "content": [
            {"type": "tool_use", "id": "r1", "name": TOOL, "input": {}},
            {"type": "tool_use", "id": "c1", "name": "Bash", "input": {}},
        ],
        "stop_reason": "tool_use",
        "usage": {},
    }
    round_ = split_message(message, TOOL)
    assert round_.client_calls == 1 and not round_.wants_reads_only
    merged = merge_messages([message], TOOL)
    assert [b["id"] for b in merged["content"]] == ["c1"] and merged["stop_reason"] == "tool_use"


def test_a_closing_note_ends_the_message_with_a_text_block() -> None:
    merger = StreamMerger(TOOL)
    merger.begin_round()
    events = round_events(
        [{"type": "tool_use", "id": "t", "name": TOOL, "input": {"ref": "r"}}], "tool_use", 10, 5
    )
    out = [b for e in events for b in merger.feed(e)]
    merger.end_round()
    out += merger.finish("[still reading]")
    seen = client_events(out)
    assert [n for n, _ in seen] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert seen[3][1]["delta"] == {"type": "text_delta", "text": "[still reading]"}
    assert seen[2][1]["index"] == seen[4][1]["index"] == 0
    whole = {
        "id": "m",
        "content": [{"type": "tool_use", "id": "t", "name": TOOL, "input": {"ref": "r"}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
    merged = merge_messages([whole], TOOL, "[still reading]")
    assert merged["content"] == [{"type": "text", "text": "[still reading]"}]
    assert merged["stop_reason"] == "end_turn"
