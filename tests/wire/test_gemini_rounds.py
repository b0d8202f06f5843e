"""read_result rounds on the Gemini API: split, merge, continue, and the stream merger.

What the client receives is read with google-genai's own response type, as the SDK reads
it; a thought signature must stay on the call the client keeps."""

from __future__ import annotations

from typing import Any

import orjson
from google.genai import types

from proxy.core.sse import Event, SSEDecoder
from proxy.core.wire_format import MergeState
from proxy.wire.gemini import GEMINI
from proxy.wire.gemini_rounds import aggregate, client_usage, continue_contents

TOOL = "read_result"


def read(ref: str = "r_1", signature: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"functionCall": {"name": TOOL, "args": {"ref": ref}}}
    if signature:
        part["thoughtSignature"] = signature
    return part


def shell(command: str, signature: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"functionCall": {"name": "run_shell_command", "args": {"c": command}}}
    if signature:
        part["thoughtSignature"] = signature
    return part


def usage(prompt: int, candidates: int, thoughts: int = 0, cached: int = 0) -> dict[str, Any]:
    return {
        "promptTokenCount": prompt,
        "cachedContentTokenCount": cached,
        "candidatesTokenCount": candidates,
        "thoughtsTokenCount": thoughts,
        "totalTokenCount": prompt + candidates + thoughts,
    }


def answer(
    parts: list[dict[str, Any]], meta: dict[str, Any], reason: str = "STOP"
) -> dict[str, Any]:
    return {
        "candidates": [
            {"content": {"role": "model", "parts": parts}, "finishReason": reason, "index": 0}
        ],
        "usageMetadata": meta,
        "modelVersion": "gemini-3-flash-preview",
        "responseId": "resp-1",
    }


def sdk(data: dict[str, Any]) -> types.GenerateContentResponse:
    return types.GenerateContentResponse.model_validate(data)


def test_split_names_reads_by_position_and_asks_on_stop() -> None:
    round_ = GEMINI.split(
        answer([{"text": "let me read"}, read("r_a", "sig")], usage(100, 9)), TOOL
    )
    assert [(r.id, r.input) for r in round_.reads] == [("call0", {"ref": "r_a"})]
    assert round_.wants_reads_only and round_.stop_reason == "STOP"
    both = GEMINI.split(answer([shell("ls", "sig"), read("r_a")], usage(100, 9)), TOOL)
    assert both.client_calls == 1 and [r.id for r in both.reads] == ["call1"]
    assert not both.wants_reads_only, "the client's call goes to the client"
    capped = GEMINI.split(answer([read()], usage(100, 9), "MAX_TOKENS"), TOOL)
    assert not capped.asks_to_read


def test_continue_answers_each_call_in_order_with_its_name_and_id() -> None:
    turn = {
        "role": "model",
        "parts": [
            read("r_a", "sig"),
            {**read("r_b"), "functionCall": {"name": TOOL, "args": {"ref": "r_b"}, "id": "x1"}},
        ],
    }
    round_ = GEMINI.split(answer(turn["parts"], usage(1, 1)), TOOL)
    out = continue_contents(
        [{"role": "user", "parts": [{"text": "q"}]}],
        round_,
        [("call1", "B", False), ("call0", "gone", True)],
    )
    assert out[1]["parts"][0]["thoughtSignature"] == "sig", "the model turn goes back as it came"
    responses = [p["functionResponse"] for p in out[2]["parts"]]
    assert responses == [
        {"name": TOOL, "response": {"error": "gone"}},
        {"name": TOOL, "id": "x1", "response": {"output": "B"}},
    ]


def test_merge_removes_reads_carries_the_signature_and_tells_the_last_prompt() -> None:
    first = answer([{"text": "Reading."}, read("r_a", "sigA")], usage(1000, 20, 5))
    second = answer(
        [{"text": "Now running."}, shell("make", None), shell("ls")], usage(3000, 30, 7, 900)
    )
    merged = GEMINI.merge([first, second], TOOL)
    parts = merged["candidates"][0]["content"]["parts"]
    assert [p.get("text") for p in parts] == ["Reading.", "\n\nNow running.", None, None]
    assert parts[2].get("thoughtSignature") is None, "round 2's calls are round 2's own"
    meta = merged["usageMetadata"]
    assert meta["promptTokenCount"] == 3000 and meta["cachedContentTokenCount"] == 900
    held = 20 + 30 - meta["candidatesTokenCount"]
    assert held > 0 and meta["thoughtsTokenCount"] == 12
    assert meta["totalTokenCount"] == 3000 + meta["candidatesTokenCount"] + 12
    assert sdk(merged).function_calls is not None
    mixed = answer([read("r_a", "sigA"), shell("ls"), shell("pwd")], usage(10, 5))
    kept = GEMINI.merge([mixed], TOOL)["candidates"][0]["content"]["parts"]
    assert kept == [{**shell("ls"), "thoughtSignature": "sigA"}, shell("pwd")]
    own = answer([read("r_a", "sigA"), shell("ls", "sigB")], usage(10, 5))
    assert GEMINI.merge([own], TOOL)["candidates"][0]["content"]["parts"] == [shell("ls", "sigB")]
    noted = GEMINI.merge([first], TOOL, note="[stopped]")
    assert noted["candidates"][0]["content"]["parts"][-1] == {"text": "\n\n[stopped]"}


def test_client_usage_of_one_round_is_that_round() -> None:
    one = usage(500, 40, 3)
    assert client_usage([one], 0) == one


# -- streams ------------------------------------------------------------------------------


def sse(*chunks: dict[str, Any]) -> list[Event]:
    raw = b"".join(b"data: " + orjson.dumps(c) + b"\r\n\r\n" for c in chunks)
    return SSEDecoder().feed(raw)


def chunk(
    parts: list[dict[str, Any]], meta: dict[str, Any] | None = None, reason: str | None = None
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if reason:
        candidate["finishReason"] = reason
    out: dict[str, Any] = {
        "candidates": [candidate],
        "modelVersion": "gemini-3-flash-preview",
        "responseId": "r1",
    }
    if meta:
        out["usageMetadata"] = meta
    return out


def client_chunks(out: list[bytes]) -> list[dict[str, Any]]:
    return [orjson.loads(e.data) for e in SSEDecoder().feed(b"".join(out))]


def test_one_round_with_nothing_held_goes_out_byte_for_byte() -> None:
    merger = GEMINI.merger(TOOL)
    events = sse(
        chunk([{"text": "Hel"}], usage(10, 1)),
        chunk([{"text": "lo", "thoughtSignature": "s"}], usage(10, 2), "STOP"),
    )
    merger.begin_round()
    out = [b for e in events for b in merger.feed(e)]
    assert merger.state is MergeState.STOPPED
    round_ = merger.end_round()
    assert not round_.reads and round_.assistant["parts"] == [
        {"text": "Hello", "thoughtSignature": "s"}
    ]
    out += merger.finish()
    assert b"".join(out) == b"".join(e.raw for e in events)


def test_a_read_round_then_an_answer_is_one_stream_without_the_read() -> None:
    merger = GEMINI.merger(TOOL)
    merger.begin_round()
    out: list[bytes] = []
    for event in sse(
        chunk([{"text": "Let me read."}]), chunk([read("r_a", "sigA")], usage(1000, 12), "STOP")
    ):
        out += merger.feed(event)
    round_ = merger.end_round()
    assert round_.wants_reads_only and [r.id for r in round_.reads] == ["call0"]
    assert round_.assistant["parts"][-1]["thoughtSignature"] == "sigA"
    merger.begin_round()
    for event in sse(
        chunk([{"text": "It says"}]), chunk([{"text": " hi."}], usage(2500, 8, 4), "STOP")
    ):
        out += merger.feed(event)
    assert not merger.end_round().reads
    out += merger.finish()
    chunks = client_chunks(out)
    assert TOOL.encode() not in b"".join(out)
    assert [c["candidates"][0].get("finishReason") for c in chunks] == [None, None, "STOP"]
    text = "".join(
        p.get("text", "") for c in chunks for p in c["candidates"][0]["content"]["parts"]
    )
    assert text == "Let me read.\n\nIt says hi."
    final = chunks[-1]["usageMetadata"]
    assert final["promptTokenCount"] == 2500 and final["thoughtsTokenCount"] == 4
    assert final["candidatesTokenCount"] < 12 + 8
    for c in chunks:
        sdk(c)


def test_a_streamed_read_beside_client_calls_hands_its_signature_on() -> None:
    merger = GEMINI.merger(TOOL)
    merger.begin_round()
    out: list[bytes] = []
    for event in sse(
        chunk([read("r_a", "sigA"), shell("ls")]), chunk([shell("pwd")], usage(50, 9), "STOP")
    ):
        out += merger.feed(event)
    round_ = merger.end_round()
    assert round_.client_calls == 2 and not round_.wants_reads_only
    out += merger.finish()
    calls = [p for c in client_chunks(out) for p in c["candidates"][0]["content"]["parts"]]
    assert calls == [{**shell("ls"), "thoughtSignature": "sigA"}, shell("pwd")]


def test_an_error_chunk_fails_the_round_and_a_cut_stream_stays_open() -> None:
    merger = GEMINI.merger(TOOL)
    merger.begin_round()
    error = {"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}
    (event,) = sse(error)
    assert merger.feed(event) == [event.raw] and merger.state is MergeState.FAILED
    cut = GEMINI.merger(TOOL)
    cut.begin_round()
    for event in sse(chunk([{"text": "half"}])):
        cut.feed(event)
    assert cut.state is MergeState.OPEN
    blocked = GEMINI.merger(TOOL)
    blocked.begin_round()
    (event,) = sse({"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": usage(5, 0)})
    assert blocked.feed(event) == [event.raw] and blocked.state is MergeState.STOPPED


def test_aggregate_joins_text_pieces_and_keeps_signatures() -> None:
    parts = [
        {"text": "a", "thought": True},
        {"text": "b", "thought": True},
        {"text": "c"},
        {"text": "d", "thoughtSignature": "s"},
        {"text": ""},
        shell("ls", "t"),
        {"text": "e"},
    ]
    assert aggregate(parts) == [
        {"text": "ab", "thought": True},
        {"text": "cd", "thoughtSignature": "s"},
        shell("ls", "t"),
        {"text": "e"},
    ]
