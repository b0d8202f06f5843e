"""The usage meter reads what the upstream reported, however the bytes are cut."""

from __future__ import annotations

import itertools

import orjson
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.budget import Amounts
from proxy.core.usage import Usage, UsageMeter
from proxy.wire import ANTHROPIC, CHAT


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
