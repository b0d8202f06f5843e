"""Counting only near the thresholds: the per-message bound decides as exact counts would.

`count_unless_quiet` skips encoding a request's new messages when their JSON's bytes,
added to the cached counts of the messages seen before, prove the history under every
threshold. These properties check that it never says so of a request whose exact counts
are over one (the decision with the bound equals the decision with exact counts), that
when it does count, it counts exactly what `count_request` counts, and that the bound
itself holds message by message on adversarial content.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.counting import (
    count_request,
    count_unless_quiet,
    history_bound,
    history_quiet,
    text_system,
)
from proxy.core.policy import Policy
from proxy.core.tokens import TOOLS_PREAMBLE, TokenCounter
from proxy.wire import ANTHROPIC, CHAT
from proxy.wire.common import request_messages
from tests.core.test_byte_bound import TEXT, anthropic_bodies, chat_bodies

AGENT = Path(__file__).parents[1] / "fixtures" / "agent-requests"


@st.composite
def policy_near(draw: st.DrawFn, size: int) -> Policy:
    """A policy whose thresholds fall around a history of `size` bytes: below, between
    the estimate and the bound, and above."""
    offload = draw(st.integers(max(1, size // 8), 2 * size + 10))
    trigger = draw(st.integers(offload, 3 * size + 20))
    target = draw(st.integers(max(1, trigger // 2), trigger))
    window = draw(st.integers(trigger + 1_000, trigger + 4 * size + 5_000))
    return Policy(window=window, trigger=trigger, target=target, offload_trigger=offload)


@settings(max_examples=150, deadline=None)
@given(anthropic_bodies())
def test_no_message_counts_more_than_its_json_bytes(body: dict[str, Any]) -> None:
    counter = TokenCounter()
    for message in request_messages(body):
        assert counter.count_message(message) <= len(orjson.dumps(message))


@settings(max_examples=200, deadline=None)
@given(anthropic_bodies(), st.data(), st.floats(0.5, 2.0), st.integers(0, 40))
def test_the_bound_decides_as_exact_counts_do(
    body: dict[str, Any], data: st.DataObject, factor: float, seen: int
) -> None:
    messages = request_messages(body)
    policy = data.draw(policy_near(len(orjson.dumps(messages))))
    counter = TokenCounter()
    # The conversation's first `seen` messages were counted by an earlier request.
    count_request(ANTHROPIC, counter, {**body, "messages": messages[:seen]}, messages[:seen])
    exact = count_request(ANTHROPIC, TokenCounter(), body, messages)
    bounded = count_unless_quiet(ANTHROPIC, counter, body, messages, policy, factor)
    if bounded is None:
        assert exact.fits(policy, factor), "waved through a history over a threshold"
    else:
        assert bounded == exact  # counted: exactly what count_request counts


@settings(max_examples=100, deadline=None)
@given(chat_bodies())
def test_no_chat_message_counts_more_than_its_json_bytes(body: dict[str, Any]) -> None:
    counter = CHAT.counter(TokenCounter())
    for message in CHAT.messages(body):
        assert counter.count_message(message) <= len(orjson.dumps(message))


@settings(max_examples=100, deadline=None)
@given(chat_bodies(), st.data(), st.floats(0.5, 2.0), st.integers(0, 40))
def test_the_bound_decides_as_exact_counts_do_for_chat(
    body: dict[str, Any], data: st.DataObject, factor: float, seen: int
) -> None:
    messages = CHAT.messages(body)
    policy = data.draw(policy_near(len(orjson.dumps(messages))))
    counter = TokenCounter()
    count_request(CHAT, counter, {**body, "messages": messages[:seen]}, messages[:seen])
    exact = count_request(CHAT, TokenCounter(), body, messages)
    bounded = count_unless_quiet(CHAT, counter, body, messages, policy, factor)
    if bounded is None:
        assert exact.fits(policy, factor), "waved through a history over a threshold"
    else:
        assert bounded == exact


def test_a_new_small_message_is_not_encoded() -> None:
    """A turn of the recorded Claude Code session whose new messages are small next to
    the offload trigger: no text is encoded, and the decision (nothing to plan) is the
    one the exact counts give."""
    body = json.loads((AGENT / "claude-code-turn7.json").read_text())["body"]
    messages = request_messages(body)
    counter = TokenCounter()
    earlier = messages[:-2]
    count_request(ANTHROPIC, counter, {**body, "messages": earlier}, earlier)
    policy = Policy(window=200_000, trigger=100_000, target=80_000)
    encoded = counter.cache_info().encode_calls
    assert count_unless_quiet(ANTHROPIC, counter, body, messages, policy, 1.0) is None
    assert counter.cache_info().encode_calls == encoded
    assert count_request(ANTHROPIC, TokenCounter(), body, messages).fits(policy, 1.0)


def test_over_a_threshold_the_request_is_counted_exactly() -> None:
    body = json.loads((AGENT / "claude-code-turn7.json").read_text())["body"]
    messages = request_messages(body)
    exact = count_request(ANTHROPIC, TokenCounter(), body, messages)
    policy = Policy(window=200_000, trigger=100_000, target=80_000, offload_trigger=1_000)
    assert exact.history > policy.quiet_tokens
    assert count_unless_quiet(ANTHROPIC, TokenCounter(), body, messages, policy, 1.0) == exact


def test_degenerate_messages_stay_within_the_bound() -> None:
    """An empty message is 2 bytes of JSON and costs the per-message overhead (4): the
    bound adds the overhead, so thousands of them cannot slip under a threshold."""
    messages: list[dict[str, Any]] = [{} for _ in range(5_000)]
    body = {"model": "m", "max_tokens": 1, "messages": messages}
    exact = count_request(ANTHROPIC, TokenCounter(), body, messages)
    assert exact.history > len(orjson.dumps(messages))
    bound = history_bound(messages, [None] * len(messages))
    assert bound is not None and bound >= exact.history
    policy = Policy(window=200_000, trigger=100_000, target=80_000, offload_trigger=15_000)
    assert not exact.fits(policy, 1.0)
    assert count_unless_quiet(ANTHROPIC, TokenCounter(), body, messages, policy, 1.0) == exact


def test_media_makes_no_bound() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
    messages = [{"role": "user", "content": [image]}]
    assert history_bound(messages, [None]) is None
    body = {"model": "m", "max_tokens": 1, "messages": messages}
    policy = Policy(window=200_000, trigger=100_000, target=80_000)
    counted = count_unless_quiet(ANTHROPIC, TokenCounter(), body, messages, policy, 1.0)
    assert counted is not None and counted.history > len(orjson.dumps(messages))


TOOL_NAMES = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {"name": TOOL_NAMES, "description": TEXT, "input_schema": st.just({"type": "object"})}
        ),
        max_size=12,
    ),
    TOOL_NAMES,
)
def test_the_injected_tool_costs_what_adding_it_adds(tools: list[Any], name: str) -> None:
    """The driver counts read_result's definition alone (no re-hashing the client's
    tools): the same number as counting the list with it and without it."""
    injected = ANTHROPIC.read_result_tool(name)
    counter = TokenCounter()
    added = counter.count_tools([*tools, injected]) - counter.count_tools(tools)
    assert added == counter.count_tools([injected]) - (TOOLS_PREAMBLE if tools else 0)


def _history_quiet_holds(wire: Any, body: dict[str, Any], policy: Policy, factor: float) -> bool:
    """history_quiet on the body as sent (orjson's writing); when it says quiet, the
    exact counts fit and count_unless_quiet says quiet too (with nothing cached)."""
    messages = wire.messages(body)
    history = orjson.dumps(messages)
    sourced = b'"source"' in history or not text_system(body)
    size = len(orjson.dumps(body))
    quiet = history_quiet(wire, size, len(history), len(messages), sourced, policy, factor)
    if quiet:
        exact = count_request(wire, TokenCounter(), body, messages)
        assert exact.fits(policy, factor), "waved through a history over a threshold"
        assert count_unless_quiet(wire, TokenCounter(), body, messages, policy, factor) is None
    return quiet


@settings(max_examples=200, deadline=None)
@given(anthropic_bodies(), st.data(), st.floats(0.5, 2.0))
def test_the_history_bytes_prove_only_what_exact_counts_say(
    body: dict[str, Any], data: st.DataObject, factor: float
) -> None:
    policy = data.draw(policy_near(len(orjson.dumps(request_messages(body)))))
    _history_quiet_holds(ANTHROPIC, body, policy, factor)


@settings(max_examples=100, deadline=None)
@given(chat_bodies(), st.data(), st.floats(0.5, 2.0))
def test_the_history_bytes_prove_only_what_exact_counts_say_for_chat(
    body: dict[str, Any], data: st.DataObject, factor: float
) -> None:
    policy = data.draw(policy_near(len(orjson.dumps(CHAT.messages(body)))))
    _history_quiet_holds(CHAT, body, policy, factor)


def test_a_short_history_under_big_tools_is_quiet_by_its_bytes() -> None:
    """The recorded Claude Code turn (49 KB, 31 KB of it tools): its body's size is over
    the default offload trigger, its history's bytes (10 KB) are under it; with an image
    it is counted."""
    body = json.loads((AGENT / "claude-code-turn1.json").read_text())["body"]
    policy = Policy(window=1_000_000)
    assert _history_quiet_holds(ANTHROPIC, body, policy, 1.0)
    assert not _history_quiet_holds(ANTHROPIC, body, policy, 3.0)  # calibrated up
    image = {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
    shown = {**body, "messages": [*body["messages"], {"role": "user", "content": [image]}]}
    assert not _history_quiet_holds(ANTHROPIC, shown, policy, 1.0)
    # (the API takes text alone in the system prompt; anything else there is counted)
    assert not _history_quiet_holds(ANTHROPIC, {**body, "system": [image]}, policy, 1.0)
