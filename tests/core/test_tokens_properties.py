"""Properties of token counting over generated requests."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.tokens import MAX_CHUNK, TokenCounter, split_for_encoding
from proxy.ops.audit import audit

COUNTER = TokenCounter()  # one warm counter across examples, as in the proxy

words = st.text(st.characters(codec="utf-8"), max_size=60)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | words,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(words, inner, max_size=4),
    max_leaves=10,
)
text_blocks = st.builds(lambda t: {"type": "text", "text": t}, words)
leaf_blocks = st.one_of(
    text_blocks,
    st.builds(lambda t: {"type": "thinking", "thinking": t, "signature": "s"}, words),
    st.builds(lambda d: {"type": "redacted_thinking", "data": d}, words),
    st.builds(
        lambda n, i: {"type": "tool_use", "id": "t", "name": n, "input": i}, words, json_values
    ),
    st.builds(lambda v: {"type": "mystery", "value": v}, json_values),
)
blocks = st.one_of(
    leaf_blocks,
    st.builds(
        lambda c: {"type": "tool_result", "tool_use_id": "t", "content": c},
        words | st.lists(leaf_blocks, max_size=3),
    ),
)
contents = words | st.lists(blocks, max_size=4)
messages = st.builds(
    lambda role, content: {"role": role, "content": content},
    st.sampled_from(["user", "assistant", "system"]),
    contents,
)
tools = st.lists(st.dictionaries(words, json_values, max_size=3), max_size=3)
requests = st.fixed_dictionaries(
    {"messages": st.lists(messages, max_size=6)},
    optional={"system": words | st.lists(text_blocks, max_size=2), "tools": tools},
)


@settings(max_examples=300, deadline=None)
@given(requests)
def test_the_total_is_the_sum_of_its_parts(body: dict[str, Any]) -> None:
    total = COUNTER.count_request(body)
    parts = (
        COUNTER.count_system(body.get("system"))
        + COUNTER.count_tools(body.get("tools"))
        + sum(COUNTER.count_message(m) for m in body["messages"])
    )
    assert total == parts == sum(p.tokens for p in audit(body, COUNTER))


@settings(max_examples=300, deadline=None)
@given(requests, st.data())
def test_adding_a_block_or_a_message_never_lowers_the_count(
    body: dict[str, Any], data: st.DataObject
) -> None:
    before = COUNTER.count_request(body)
    grown = {**body, "messages": [*body["messages"], data.draw(messages)]}
    assert COUNTER.count_request(grown) >= before
    lists = [i for i, m in enumerate(body["messages"]) if isinstance(m["content"], list)]
    if lists:
        i = data.draw(st.sampled_from(lists))
        extended = [dict(m) for m in body["messages"]]
        extended[i]["content"] = [*extended[i]["content"], data.draw(blocks)]
        assert COUNTER.count_request({**body, "messages": extended}) >= before


@settings(max_examples=200, deadline=None)
@given(requests)
def test_counts_do_not_depend_on_what_the_cache_has_seen(body: dict[str, Any]) -> None:
    fresh = TokenCounter(cache_size=5)
    assert fresh.count_request(body) == COUNTER.count_request(body) == fresh.count_request(body)


@settings(max_examples=300, deadline=None)
@given(
    st.text(st.sampled_from("ab \n="), max_size=3 * MAX_CHUNK) | st.text(max_size=2 * MAX_CHUNK),
    st.integers(2, MAX_CHUNK),
)
def test_split_loses_nothing_and_bounds_every_piece(text: str, max_chunk: int) -> None:
    pieces = split_for_encoding(text, max_chunk)
    assert "".join(pieces) == text
    assert all(0 < len(p) <= max_chunk for p in pieces)
    assert all(len(p) >= max_chunk // 2 for p in pieces[:-1])
