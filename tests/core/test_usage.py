"""The usage meter reads what the upstream reported, however the bytes are cut."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.budget import Amounts
from proxy.core.usage import Usage, UsageMeter, UsageScan
from proxy.server.passthrough import ANY_USAGE
from proxy.wire import ANTHROPIC, CHAT, GEMINI, RESPONSES


def _sse(name: str, data: dict[str, object]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _stream(text: str, usage_in: dict[str, int], output: int, *, finished: bool = True) -> bytes:
    start = {"usage": {**usage_in, "output_tokens": 1}, "content": []}
    parts = [
        _sse("message_start", {"type": "message_start", "message": start}),
        _sse("ping", {"type": "ping"}),
        _sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        ),
    ]
    for i in range(0, len(text), 40):
        delta = {"type": "text_delta", "text": text[i : i + 40]}
        parts.append(
            _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
        )
    if finished:
        parts.append(
            _sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn"},
                    "usage": {"output_tokens": output},
                },
            )
        )
        parts.append(_sse("message_stop", {"type": "message_stop"}))
    return b"".join(parts)


USAGE = {"input_tokens": 10, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 1000}
RESERVED = Amounts(2000, 500, 3000)


def _cuts(data: bytes) -> st.SearchStrategy[list[bytes]]:
    def split(points: list[int]) -> list[bytes]:
        edges = [0, *sorted(set(points)), len(data)]
        return [data[a:b] for a, b in itertools.pairwise(edges)]

    return st.lists(st.integers(0, len(data)), max_size=30).map(split)


STREAM = _stream("word " * 300, USAGE, 321)


@given(_cuts(STREAM))
def test_stream_usage_does_not_depend_on_chunking(chunks: list[bytes]) -> None:
    meter = UsageMeter(ANTHROPIC)
    for chunk in chunks:
        meter.chunk(chunk)
    # 10 + 100 * 1.25 + 1000 * 0.1
    assert meter.cost(RESERVED) == Amounts(1110, 321, 235)


def test_rounds_add_up_and_bodies_count() -> None:
    meter = UsageMeter(ANTHROPIC)
    meter.chunk(STREAM)
    meter.chunk(STREAM)
    meter.body({"content": [], "usage": {"input_tokens": 5, "output_tokens": 2}})
    meter.summariser(Usage(input_tokens=50, output_tokens=20))
    assert meter.cost(RESERVED) == Amounts(1110 * 2 + 5 + 50, 321 * 2 + 2 + 20, 235 * 2 + 55)


_USAGES = st.builds(Usage, *(st.integers(0, 10**9) for _ in range(5)))


@given(st.lists(_USAGES, max_size=5))
def test_the_total_is_every_rounds_usage_summed(usages: list[Usage]) -> None:
    meter = UsageMeter(ANTHROPIC)
    for usage in usages:
        meter.round(usage)
    summed = Usage()
    for usage in usages:
        summed = summed.plus(usage)
    assert meter.total() == summed


def test_a_cut_stream_estimates_output_from_its_text_within_the_reservation() -> None:
    cut = _stream("word " * 300, USAGE, 0, finished=False)
    meter = UsageMeter(ANTHROPIC)
    meter.chunk(cut)
    cost = meter.cost(RESERVED)
    assert cost.input == 1110
    assert 1500 // 4 <= cost.output <= RESERVED.output  # 1,500 characters were streamed
    small = meter.cost(Amounts(2000, 100, 3000))
    assert small.output == 100


def test_an_answer_without_usage_costs_its_reservation_and_none_costs_nothing() -> None:
    meter = UsageMeter(ANTHROPIC)
    assert meter.cost(RESERVED) == Amounts()
    meter.body({"content": "no usage"})
    assert meter.cost(RESERVED) == RESERVED


def test_openai_usage_chunk_and_body() -> None:
    usage = {
        "prompt_tokens": 120,
        "completion_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 100},
    }
    meter = UsageMeter(CHAT)
    meter.chunk(b'data: {"id":"c","choices":[{"delta":{"content":"hi"}}]}\n\n')
    meter.chunk(b"data: " + orjson.dumps({"id": "c", "choices": [], "usage": usage}) + b"\n\n")
    meter.chunk(b"data: [DONE]\n\n")
    assert meter.cost(RESERVED) == Amounts(120, 9, 30)
    whole = UsageMeter(CHAT)
    whole.body({"choices": [], "usage": usage})
    assert whole.cost(RESERVED) == Amounts(120, 9, 30)


def test_a_long_text_line_is_skipped_not_buffered() -> None:
    meter = UsageMeter(ANTHROPIC)
    meter.chunk(STREAM[:400])
    big = b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"'
    meter.chunk(big)
    for _ in range(100):
        meter.chunk(b"x" * 10_000)
    meter.chunk(b'"}}\n\n')
    assert len(meter._carry) < 100
    meter.chunk(STREAM[400:])
    assert meter.cost(RESERVED).input == 1110


def _line_by_line(scan: UsageScan, data: bytes) -> UsageMeter:
    """A reference reading: every line of a whole stream looked at, none passed over."""
    meter = UsageMeter(scan)
    meter.seen_answer = True
    for line in data.split(b"\n"):
        if line and scan.line_may_matter(line[:64]):
            meter._usage(line)
        elif line and meter.rounds and (chars := scan.text_chars(line)):
            meter.rounds[-1].text_chars += chars
    return meter


def _chat_stream(text: str) -> bytes:
    chunks = [
        {"id": "c", "choices": [{"delta": {"content": text[i : i + 7]}}]}
        for i in range(0, len(text), 7)
    ]
    usage = {"prompt_tokens": 50, "completion_tokens": 12}
    chunks.append({"id": "c", "choices": [], "usage": usage})
    return b"".join(b"data: " + orjson.dumps(c) + b"\r\n\r\n" for c in chunks) + b"data: [DONE]\n\n"


def _responses_stream(text: str) -> bytes:
    events = [
        {"type": "response.output_text.delta", "delta": text[i : i + 9]}
        for i in range(0, len(text), 9)
    ]
    usage = {"input_tokens": 40, "output_tokens": 7, "input_tokens_details": {"cached_tokens": 8}}
    events.append({"type": "response.completed", "response": {"usage": usage}})
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    )


def _gemini_stream(text: str) -> bytes:
    parts = [
        {"candidates": [{"content": {"parts": [{"text": text[i : i + 11]}]}}]}
        for i in range(0, len(text), 11)
    ]
    usage = {"promptTokenCount": 30, "candidatesTokenCount": 5}
    parts.append({"candidates": [{"finishReason": "STOP"}], "usageMetadata": usage})
    return b"".join(b"data: " + orjson.dumps(p) + b"\n\n" for p in parts)


STREAMS = [
    (ANTHROPIC, STREAM),
    (ANTHROPIC, _stream("a cut answer " * 20, USAGE, 0, finished=False)),
    (CHAT, _chat_stream("some words of a chat answer " * 5)),
    (RESPONSES, _responses_stream("a responses answer " * 5)),
    (GEMINI, _gemini_stream("a gemini answer " * 5)),
    (ANY_USAGE, _chat_stream("passed through " * 5)),
    (ANY_USAGE, STREAM),
]


def _line_cuts(data: bytes) -> st.SearchStrategy[list[bytes]]:
    ends = [i + 1 for i, byte in enumerate(data) if byte == 10]

    def split(points: list[int]) -> list[bytes]:
        edges = [0, *sorted(set(points)), len(data)]
        return [data[a:b] for a, b in itertools.pairwise(edges)]

    return st.lists(st.sampled_from(ends), max_size=30).map(split)


def _case(cuts: Any) -> st.SearchStrategy[tuple[int, list[bytes]]]:
    return st.sampled_from(range(len(STREAMS))).flatmap(
        lambda i: st.tuples(st.just(i), cuts(STREAMS[i][1]))
    )


@given(st.one_of(_case(_cuts), _case(_line_cuts)))
def test_the_lines_a_format_passes_over_change_no_reading(case: tuple[int, list[bytes]]) -> None:
    """However the stream is cut, the meter reads what looking at every line reads: the
    lines its format's pattern passes over hold neither usage nor text. (A text line cut
    in two is counted by its first part: the same with every line looked at.)"""
    index, chunks = case
    scan, data = STREAMS[index]
    meter = UsageMeter(scan)
    for chunk in chunks:
        meter.chunk(chunk)
    reference = _line_by_line(scan, data)
    assert meter.rounds, "the stream has usage"
    assert [(r.usage, r.finished) for r in meter.rounds] == [
        (r.usage, r.finished) for r in reference.rounds
    ]
    if all(chunk.endswith(b"\n") for chunk in chunks[:-1]):
        assert meter.rounds == reference.rounds  # the text seen too
    assert meter.response_model == reference.response_model
    assert meter.complete == reference.complete
