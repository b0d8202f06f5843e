"""Whatever the rounds hold, the client sees one well-formed message."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.sse import SSEDecoder
from proxy.wire.anthropic_rounds import StreamMerger, consistent_with_start
from tests.wire.test_anthropic_rounds import TOOL, round_events

blocks = st.lists(
    st.one_of(
        st.builds(lambda t: {"type": "text", "text": t}, st.text(min_size=1, max_size=20)),
        st.builds(
            lambda n, name: {
                "type": "tool_use",
                "id": f"toolu_{n}",
                "name": name,
                "input": {"ref": f"r_{n}", "start": n},
            },
            st.integers(0, 10_000),
            st.sampled_from([TOOL, "Bash"]),
        ),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=300)
@given(st.lists(blocks, min_size=1, max_size=4), st.integers(0, 3))
def test_the_client_sees_one_well_formed_message(
    rounds: list[list[dict[str, Any]]], cut: int
) -> None:
    merger = StreamMerger(TOOL)
    out: list[bytes] = []
    expected_client_blocks = 0
    for n, content in enumerate(rounds):
        merger.begin_round()
        stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
        for event in round_events(content, stop, 100 + n, 10 + n):
            out += merger.feed(event)
        round_ = merger.end_round()
        expected_client_blocks += sum(
            1 for b in content if not (b["type"] == "tool_use" and b["name"] == TOOL)
        )
        assert round_.assistant["content"] == [
            {**b, "input": b["input"]} if b["type"] == "tool_use" else b for b in content
        ], "the round's blocks are rebuilt exactly for the next request"
        if not round_.wants_reads_only or n == cut:
            break
    out += merger.finish()

    events = [(e.name, orjson.loads(e.data)) for e in SSEDecoder().feed(b"".join(out))]
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("message_start") == names.count("message_stop") == 1
    starts = [d["index"] for name, d in events if name == "content_block_start"]
    stops = [d["index"] for name, d in events if name == "content_block_stop"]
    assert starts == stops == list(range(expected_client_blocks))
    assert all(
        d["content_block"].get("name") != TOOL
        for name, d in events
        if name == "content_block_start"
    )
    open_blocks: set[int] = set()
    for name, d in events:
        if name == "content_block_start":
            open_blocks.add(d["index"])
        elif name == "content_block_delta":
            assert d["index"] in open_blocks
        elif name == "content_block_stop":
            open_blocks.remove(d["index"])
    assert not open_blocks
    (delta,) = [d for name, d in events if name == "message_delta"]
    client_calls = any(
        d["content_block"]["type"] == "tool_use"
        for name, d in events
        if name == "content_block_start"
    )
    if delta["delta"]["stop_reason"] == "tool_use":
        assert client_calls, "tool_use is only the stop reason when the client has a call"


INPUTS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
counts = st.integers(0, 200_000)


@given(st.tuples(counts, counts, counts), st.tuples(counts, counts, counts))
def test_a_client_merging_start_and_delta_either_way_ends_with_the_last_round(
    start: tuple[int, int, int], last: tuple[int, int, int]
) -> None:
    """Clients merge message_delta's usage over message_start's by overwriting every
    field, or (Claude Code) only the non-zero ones: both must end with the last round's
    total input, so an agent sizing its context from it is told the truth."""
    start_usage = dict(zip(INPUTS, start, strict=True))
    final = consistent_with_start(dict(zip(INPUTS, last, strict=True)), start_usage)
    overwrite = {k: final[k] for k in INPUTS}
    nonzero = {k: final[k] if final[k] else start_usage[k] for k in INPUTS}
    if sum(last) >= 2 * len(INPUTS):  # room to move a token where one is needed
        assert sum(overwrite.values()) == sum(nonzero.values()) == sum(last)
        assert all(abs(final[k] - v) <= 2 for k, v in zip(INPUTS, last, strict=True))
