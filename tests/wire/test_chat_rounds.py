"""Merging read_result rounds into one Chat completion: streamed and whole agree.

Rounds are generated as the stand-in would answer them (its chunking, ids, usage), fed to
ChatStreamMerger, and the client's stream is checked against the rules a Chat client
relies on and against merge_completions of the same rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.sse import SSEDecoder
from proxy.core.wire_format import MergeState, ReadCall
from proxy.testing.api_chat import chunks
from proxy.wire.chat_rounds import (
    ROUND_SEPARATOR,
    ChatStreamMerger,
    continue_messages,
    merge_completions,
    split_completion,
)

TOOL = "read_result"


@dataclass(frozen=True)
class ChatAnswer:
    """One round's answer: its text, tool_calls, finish_reason and completion tokens."""

    text: str | None
    calls: list[dict[str, Any]]
    finish_reason: str
    completion_tokens: int


def call(n: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    function = {"name": name, "arguments": orjson.dumps(arguments).decode()}
    return {"id": f"call_{name}_{n}", "type": "function", "function": function}


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def completion(k: int, answer: ChatAnswer, use: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.text}
    if answer.calls:
        message["tool_calls"] = answer.calls
    return {
        "id": f"chatcmpl-{k}",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-test",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": answer.finish_reason,
            }
        ],
        "usage": use,
    }


def stream_bytes(k: int, answer: ChatAnswer, use: dict[str, Any], include_usage: bool) -> bytes:
    return b"".join(e.sse() for e in chunks(completion(k, answer, use), 3, include_usage))


@st.composite
def rounds(draw: st.DrawFn) -> list[ChatAnswer]:
    """Some read_result rounds, then the round the client sees the end of."""
    out = []
    text = st.one_of(st.none(), st.sampled_from(["Let me read it.", "Reading more of the log"]))
    for n in range(draw(st.integers(0, 3))):
        read = call(n, TOOL, {"ref": "r_" + "0" * 16, "start": n * 100})
        out.append(ChatAnswer(draw(text), [read], "tool_calls", 7))
    clients = [call(k, "Bash", {"command": f"ls {k}"}) for k in range(draw(st.integers(0, 2)))]
    last_text = draw(st.one_of(st.none(), st.just("The answer is 42.")))
    if not clients and last_text is None:
        last_text = "Done."
    out.append(ChatAnswer(last_text, clients, "tool_calls" if clients else "stop", 9))
    return out


def merged_stream(answers: list[ChatAnswer], include_usage: bool) -> tuple[bytes, bytes]:
    """(what the upstream sent in all, what the client got)."""
    merger = ChatStreamMerger(TOOL)
    sent, got = [], []
    for k, answer in enumerate(answers):
        merger.begin_round()
        raw = stream_bytes(k, answer, usage(100 + k, 9, 50), include_usage)
        sent.append(raw)
        decoder = SSEDecoder()
        for piece in [raw[i : i + 37] for i in range(0, len(raw), 37)]:
            for event in decoder.feed(piece):
                got.extend(merger.feed(event))
        assert merger.state is MergeState.STOPPED
        merger.end_round()
    got.extend(merger.finish())
    return b"".join(sent), b"".join(got)


def client_view(stream: bytes) -> dict[str, Any]:
    """What a Chat client assembles from the stream, checking the framing on the way."""
    datas = [e.data for e in SSEDecoder().feed(stream)]
    assert datas.count("[DONE]") == 1 and datas[-1] == "[DONE]"
    chunks = [orjson.loads(d) for d in datas[:-1]]
    assert len({c["id"] for c in chunks}) == 1, "one completion id throughout"
    text, calls, finishes, usages = "", {}, [], []
    for c in chunks:
        if c.get("usage"):
            usages.append(c["usage"])
        for choice in c["choices"]:
            delta = choice["delta"]
            text += delta.get("content") or ""
            for tc in delta.get("tool_calls") or []:
                entry = calls.setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
                entry["id"] = tc.get("id") or entry["id"]
                function = tc.get("function") or {}
                entry["name"] = function.get("name") or entry["name"]
                entry["arguments"] += function.get("arguments") or ""
            if choice.get("finish_reason"):
                finishes.append(choice["finish_reason"])
    assert len(finishes) == 1, "exactly one finish_reason"
    assert sorted(calls) == list(range(len(calls))), "tool_call indices start at 0, no gaps"
    return {"text": text, "calls": [calls[i] for i in sorted(calls)], "finish": finishes[0],
            "usage": usages}  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(rounds(), st.booleans())
def test_streamed_rounds_merge_like_whole_ones(answers: list[ChatAnswer], usage_on: bool) -> None:
    sent, got = merged_stream(answers, usage_on)
    if len(answers) == 1:
        assert got == sent, "one round and nothing held: the bytes as they came"
    view = client_view(got)
    whole = merge_completions(
        [completion(k, a, usage(100 + k, 9, 50)) for k, a in enumerate(answers)], TOOL
    )
    message = whole["choices"][0]["message"]
    assert view["text"] == (message["content"] or "")
    assert [(c["id"], c["name"], c["arguments"]) for c in view["calls"]] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"])
        for c in message.get("tool_calls", [])
    ]
    assert all(c["name"] != TOOL for c in view["calls"])
    assert view["finish"] == whole["choices"][0]["finish_reason"]
    if usage_on:
        assert view["usage"] == [whole["usage"]]
        # The last round's prompt (what the model saw last), every round's completion
        # less the held read_result calls.
        assert whole["usage"]["prompt_tokens"] == 100 + len(answers) - 1
        assert whole["usage"]["prompt_tokens_details"]["cached_tokens"] == 50
        completion_tokens = whole["usage"]["completion_tokens"]
        assert 0 <= completion_tokens <= 9 * len(answers)
        assert whole["usage"]["total_tokens"] == 100 + len(answers) - 1 + completion_tokens
    else:
        assert view["usage"] == []


def test_texts_of_rounds_are_separated_once() -> None:
    read = call(0, TOOL, {"ref": "r_" + "1" * 16})
    answers = [
        ChatAnswer("Let me read it.", [read], "tool_calls", 5),
        ChatAnswer("It says 42.", [], "stop", 5),
    ]
    _, got = merged_stream(answers, include_usage=False)
    assert client_view(got)["text"] == "Let me read it." + ROUND_SEPARATOR + "It says 42."
    assert client_view(got)["finish"] == "stop"


def test_split_and_continue_give_valid_chat_messages() -> None:
    read = call(0, TOOL, {"ref": "r_" + "2" * 16, "start": 5, "length": 10})
    bad = {**call(1, TOOL, {}), "function": {"name": TOOL, "arguments": "{not json"}}
    answer = completion(0, ChatAnswer("Reading.", [read, bad], "tool_calls", 3), usage(1, 1, 0))
    round_ = split_completion(answer, TOOL)
    assert round_.wants_reads_only and round_.client_calls == 0
    wanted = {"ref": "r_" + "2" * 16, "start": 5, "length": 10}
    assert round_.reads[0] == ReadCall(read["id"], wanted)
    assert round_.reads[1].input is None, "unparseable arguments are the model's to fix"
    results = [(read["id"], "[characters 5 to 15 of 99.]", False), (bad["id"], "bad", True)]
    messages = continue_messages([{"role": "user", "content": "q"}], round_, results)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert messages[1]["tool_calls"] == [read, bad]
    assert [m["tool_call_id"] for m in messages[2:]] == [read["id"], bad["id"]]


def test_a_read_mixed_with_client_calls_ends_the_rounds() -> None:
    mixed = [call(0, TOOL, {"ref": "r_" + "3" * 16}), call(1, "Bash", {"command": "ls"})]
    round_ = split_completion(
        completion(0, ChatAnswer(None, mixed, "tool_calls", 3), usage(1, 1, 0)), TOOL
    )
    assert not round_.wants_reads_only
    merged = merge_completions([completion(0, ChatAnswer(None, mixed, "tool_calls", 3), {})], TOOL)
    assert [c["function"]["name"] for c in merged["choices"][0]["message"]["tool_calls"]] == [
        "Bash"
    ]
