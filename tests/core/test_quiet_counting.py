"""A quiet request counted without sha256: in-process count keys, digests only when planned.

Before, each message's count was cached under its sha256 match digest and form, so every
request paid a sha256 per message (and one of its tools) before the bound could prove it
quiet. A reference of that keying (`reference_print`, the digest code as it was) checks
that the cheap keys find the same cached counts, so the quiet decision is the one the
sha256 keys gave; that a counted request's digests, forms and breakpoints are the sha256
ones, byte for byte (they are persisted and compared across replicas); and that a warm,
salted cache returns the counts a fresh counter makes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core import counting
from proxy.core.counting import Counted, count_request, count_tokens, count_unless_quiet
from proxy.core.policy import Policy
from proxy.core.tokens import MESSAGE_OVERHEAD, TEXT_DOMAIN, TOOLS_DOMAIN, TokenCounter
from proxy.core.wire_format import Request
from proxy.wire import ANTHROPIC, CHAT
from tests.core.test_byte_bound import anthropic_bodies, chat_bodies
from tests.core.test_count_bound import policy_near

AGENT = Path(__file__).parents[1] / "fixtures" / "agent-requests"
MARK = {"type": "ephemeral"}


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def reference_print(message: dict[str, Any]) -> tuple[bytes, int, int]:
    """The match digest, form and breakpoints as main (d26c9cc) made them."""
    raw = orjson.dumps(message)
    content = message.get("content")
    string_form = isinstance(content, str)
    breakpoints = raw.count(b'"cache_control"')
    marked = breakpoints > 0
    if not string_form and not marked:
        return hashlib.sha256(raw).digest()[:16], 0, 0
    shape: Any = _strip(message) if marked else message
    if string_form:
        shape = {**shape, "content": [{"type": "text", "text": content}]}
    digest = hashlib.sha256(orjson.dumps(shape)).digest()[:16]
    return digest, 1 + string_form + 2 * marked, breakpoints


def reference_quiet(
    wire: Request,
    earlier: list[list[dict[str, Any]]],
    body: dict[str, Any],
    messages: list[dict[str, Any]],
    policy: Any,
    factor: float,
) -> bool:
    """Whether the request was quiet with counts cached under (sha256 digest, form)."""
    counter = wire.counter(TokenCounter())
    cache: dict[tuple[bytes, int], int] = {}
    for seen in earlier:
        for message in seen:
            digest, form, _ = reference_print(message)
            cache[digest, form] = counter.count_message(message)
    found = [cache.get(reference_print(m)[:2]) for m in messages]
    fixed = wire.fixed_tokens(counter, body)
    known = sum(count for count in found if count is not None)
    if not Counted(fixed, [known], []).fits(policy, factor):
        return False
    bound = 0
    for message, count in zip(messages, found, strict=True):
        raw = orjson.dumps(message)
        if count is None and b'"source"' in raw:
            return False
        bound += count if count is not None else len(raw) + MESSAGE_OVERHEAD
    return Counted(fixed, [bound], []).fits(policy, factor)


@st.composite
def variant(draw: st.DrawFn, message: dict[str, Any]) -> dict[str, Any]:
    """The message as an agent may send it again: as it was, with a breakpoint put on
    one of its blocks, or its string content as a text block."""
    content = message.get("content")
    choice = draw(st.sampled_from(["same", "mark", "blocks"]))
    if choice == "blocks" and isinstance(content, str):
        return {**message, "content": [{"type": "text", "text": content}]}
    if choice == "mark" and isinstance(content, list) and content:
        at = draw(st.integers(0, len(content) - 1))
        blocks = [
            {**b, "cache_control": MARK} if i == at and isinstance(b, dict) else b
            for i, b in enumerate(content)
        ]
        return {**message, "content": blocks}
    return message


@st.composite
def conversations(
    draw: st.DrawFn, bodies: Any
) -> tuple[dict[str, Any], list[list[dict[str, Any]]]]:
    """A request and the earlier requests of its conversation (prefixes of its history,
    each message in one of its variants), whose counts are in the cache."""
    body = draw(bodies)
    messages = [draw(variant(m)) for m in body["messages"]]
    earlier = [
        [draw(variant(m)) for m in messages[: draw(st.integers(0, len(messages)))]]
        for _ in range(draw(st.integers(0, 2)))
    ]
    return {**body, "messages": messages}, earlier


def _check(
    wire: Request,
    body: dict[str, Any],
    earlier: list[list[dict[str, Any]]],
    policy: Any,
    factor: float,
) -> None:
    messages = wire.messages(body)
    counter = TokenCounter(salt=b"per-process secret")
    for seen in earlier:
        count_request(wire, counter, {**body, "messages": seen}, seen)
    counted = count_unless_quiet(wire, counter, body, messages, policy, factor)
    assert (counted is None) == reference_quiet(wire, earlier, body, messages, policy, factor)
    exact = count_request(wire, TokenCounter(), body, messages)
    prints = [reference_print(m) for m in messages]
    assert exact.digests == [digest for digest, _, _ in prints]
    assert exact.forms == bytes(form for _, form, _ in prints)
    assert exact.breakpoints == sum(marks for _, _, marks in prints)
    if counted is not None:
        assert counted == exact  # counts, digests, forms, breakpoints: all as a fresh count


@settings(max_examples=200, deadline=None)
@given(conversations(anthropic_bodies()), st.data(), st.floats(0.5, 2.0))
def test_the_quiet_decision_and_the_digests_are_the_sha256_keys_ones(
    request_: tuple[dict[str, Any], list[list[dict[str, Any]]]],
    data: st.DataObject,
    factor: float,
) -> None:
    body, earlier = request_
    policy = data.draw(policy_near(len(orjson.dumps(body["messages"]))))
    _check(ANTHROPIC, body, earlier, policy, factor)


@settings(max_examples=100, deadline=None)
@given(conversations(chat_bodies()), st.data(), st.floats(0.5, 2.0))
def test_the_same_for_chat(
    request_: tuple[dict[str, Any], list[list[dict[str, Any]]]],
    data: st.DataObject,
    factor: float,
) -> None:
    body, earlier = request_
    policy = data.draw(policy_near(len(orjson.dumps(body["messages"]))))
    _check(CHAT, body, earlier, policy, factor)


@settings(max_examples=100, deadline=None)
@given(anthropic_bodies(), st.binary(max_size=16))
def test_a_warm_salted_cache_returns_a_fresh_counters_counts(
    body: dict[str, Any], salt: bytes
) -> None:
    warm = TokenCounter(salt=salt)
    first = warm.count_request(body)
    assert warm.count_request(body) == first == TokenCounter().count_request(body)
    for message in body["messages"]:
        assert warm.count_message(message) == TokenCounter().count_message(message)


def test_keys_part_domains_and_salts() -> None:
    """Equal bytes counted two ways (as text, as a tools list) get two keys, and two
    salts two keys: a count is only found as what it was counted as."""
    assert TokenCounter().key(b"x", TEXT_DOMAIN) == TokenCounter().key(b"x", TEXT_DOMAIN)
    counter = TokenCounter(salt=b"a")
    data = b'[{"name":"t"}]'
    assert counter.key(data, TEXT_DOMAIN) != counter.key(data, TOOLS_DOMAIN)
    assert counter.key(data, TEXT_DOMAIN) != TokenCounter(salt=b"b").key(data, TEXT_DOMAIN)
    assert counter.key(data, TEXT_DOMAIN) == TokenCounter(salt=b"a").key(data, TEXT_DOMAIN)
    text = data.decode()
    assert counter.count_text(text) != counter.count_tools([{"name": "t"}])
    assert counter.count_text(text) == TokenCounter().count_text(text)


def test_a_quiet_request_makes_no_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    """overhead.py's Claude Code turn under the default policy: proved quiet by its
    bound without one sha256; over a threshold it is counted with its digests."""
    body = json.loads((AGENT / "claude-code-turn1.json").read_text())["body"]
    messages = ANTHROPIC.messages(body)
    quiet = Policy(window=200_000, trigger=100_000, target=80_000)
    loud = Policy(window=200_000, trigger=100_000, target=80_000, offload_trigger=1_000)
    expected = count_request(ANTHROPIC, TokenCounter(), body, messages)

    def no_digest(data: bytes) -> bytes:
        raise AssertionError("a quiet request made a match digest")

    with monkeypatch.context() as patched:
        patched.setattr(counting, "digest", no_digest)
        assert count_unless_quiet(ANTHROPIC, TokenCounter(), body, messages, quiet, 1.0) is None
    assert count_unless_quiet(ANTHROPIC, TokenCounter(), body, messages, loud, 1.0) == expected


def test_a_large_message_is_keyed_by_its_digest() -> None:
    """A message of DIGEST_KEYED_BYTES or more: its count is found again, and its digest
    is the sha256 one."""
    big = {"role": "user", "content": [{"type": "text", "text": "word " * 20_000}]}
    messages = [{"role": "user", "content": "hi"}, big, {**big, "content": "word " * 20_000}]
    body = {"model": "m", "max_tokens": 1, "messages": messages}
    counter = TokenCounter()
    first = count_request(ANTHROPIC, counter, body, messages)
    encoded = counter.cache_info().encode_calls
    assert count_request(ANTHROPIC, counter, body, messages) == first
    assert counter.cache_info().encode_calls == encoded
    assert first.digests == [reference_print(m)[0] for m in messages]
    assert first == count_request(ANTHROPIC, TokenCounter(), body, messages)
    roomy = Policy(window=2_000_000, trigger=1_800_000, target=600_000, offload_trigger=500_000)
    assert count_unless_quiet(ANTHROPIC, counter, body, messages, roomy, 1.0) is None


@pytest.mark.parametrize("fmt", ["messages", "chat"])
@settings(max_examples=60, deadline=None)
@given(data=st.data(), warm=st.booleans())
def test_count_tokens_is_count_request_without_the_digests(
    fmt: str, data: st.DataObject, warm: bool
) -> None:
    wire, bodies = (ANTHROPIC, anthropic_bodies()) if fmt == "messages" else (CHAT, chat_bodies())
    body = data.draw(bodies)
    counter = TokenCounter()
    if warm:  # from the cache, as from a fresh count
        count_request(wire, counter, body, body["messages"])
    counts = count_tokens(wire, counter, body, body["messages"])
    exact = count_request(wire, TokenCounter(), body, body["messages"])
    assert counts == dataclasses.replace(exact, digests=[])


def test_deferred_tools_kept_per_line_follow_the_tools_the_messages_load() -> None:
    """The fixed count of a line with a deferred tool (tool search) is kept while the
    system, the tools and the tools the messages load stay the same; a new message that
    loads the deferred tool (a `tool_reference`) changes it, as counting afresh does."""
    from proxy.core.reuse import Reuse

    tools = [
        {"name": "Bash", "description": "run " * 50, "input_schema": {"type": "object"}},
        {
            "name": "Deep",
            "description": "deferred " * 400,
            "input_schema": {"type": "object"},
            "defer_loading": True,
        },
    ]
    asks = {"role": "user", "content": [{"type": "text", "text": "find a tool " * 20}]}
    call = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {}}],
    }
    loads = {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": [{"type": "tool_reference", "tool_name": "Deep"}],
            }
        ],
    }

    def body(messages: list[dict[str, Any]]) -> bytes:
        return orjson.dumps(
            {"model": "m", "messages": messages, "system": "sys " * 30, "tools": tools}
        )

    reuse, counter = Reuse(1 << 30), TokenCounter()
    wire = ANTHROPIC
    fixed = []
    for messages in ([asks], [asks], [asks, call, loads], [asks, call, loads]):
        payload, seen = reuse.parse("k", body(messages), "messages")
        assert seen is not None
        counted = counting._count(
            wire, counter, payload, wire.messages(payload), None, 1.0, seen=seen
        )
        assert counted is not None
        assert counted.fixed == wire.fixed_tokens(wire.counter(TokenCounter()), payload)
        fixed.append(counted.fixed)
    assert fixed[0] == fixed[1] < fixed[2] == fixed[3]
