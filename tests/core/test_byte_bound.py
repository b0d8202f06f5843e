"""The byte-length shortcut is sound: a body's estimate never exceeds its bytes + slack.

`cannot_cross` lets the Compactor forward a request without counting it when its size
alone proves it is under the trigger; if the estimate could exceed the bytes, a request
over the trigger would slip through untouched. These properties check the bound itself
on adversarial bodies (tiny messages and blocks, many tools, emoji, CJK, tool calls).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.counting import BYTE_BOUND_SLACK, cannot_cross, count_request
from proxy.core.policy import Policy
from proxy.core.tokens import default_counter
from proxy.wire import ANTHROPIC, CHAT
from proxy.wire.common import request_messages

AGENT = Path(__file__).parents[1] / "fixtures" / "agent-requests"
TEXT = st.text(
    st.one_of(
        st.characters(exclude_categories=("Cs",)),
        st.sampled_from(["😀", "漢", "é", " ", "\n", "{", '"']),
    ),
    max_size=40,
)


def estimate(fmt: Any, body: dict[str, Any]) -> int:
    counted = count_request(fmt, default_counter(), body, request_messages(body))
    return counted.fixed + counted.history


@st.composite
def anthropic_bodies(draw: st.DrawFn) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for n in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["text", "blocks", "call", "thinking"]))
        if kind == "text":
            messages.append({"role": "user", "content": draw(TEXT)})
        elif kind == "blocks":
            blocks = [{"type": "text", "text": draw(TEXT)} for _ in range(draw(st.integers(1, 6)))]
            messages.append({"role": "user", "content": blocks})
        elif kind == "call":
            call = {
                "type": "tool_use",
                "id": f"t{n}",
                "name": draw(TEXT),
                "input": {"a": draw(TEXT)},
            }
            messages.append({"role": "assistant", "content": [call]})
            result = {"type": "tool_result", "tool_use_id": f"t{n}", "content": draw(TEXT)}
            messages.append({"role": "user", "content": [result]})
        else:
            think = {"type": "thinking", "thinking": draw(TEXT), "signature": "s"}
            messages.append(
                {"role": "assistant", "content": [think, {"type": "text", "text": "x"}]}
            )
    tools = [{"name": f"t{i}", "input_schema": {}} for i in range(draw(st.integers(0, 30)))]
    body: dict[str, Any] = {"model": "m", "max_tokens": 1, "messages": messages}
    if tools:
        body["tools"] = tools
    if draw(st.booleans()):
        body["system"] = [{"type": "text", "text": draw(TEXT)}]
    return body


@st.composite
def chat_bodies(draw: st.DrawFn) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": draw(TEXT)}]
    for n in range(draw(st.integers(1, 40))):
        if draw(st.booleans()):
            messages.append({"role": "user", "content": draw(TEXT)})
        else:
            call = {
                "id": f"c{n}",
                "type": "function",
                "function": {"name": draw(TEXT), "arguments": draw(TEXT)},
            }
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": draw(TEXT)})
    tools = [
        {"type": "function", "function": {"name": f"f{i}", "parameters": {}}}
        for i in range(draw(st.integers(0, 30)))
    ]
    body: dict[str, Any] = {"model": "gpt-x", "messages": messages}
    if tools:
        body["tools"] = tools
    return body


@settings(max_examples=400, deadline=None)
@given(anthropic_bodies())
def test_anthropic_estimate_is_within_bytes_plus_slack(body: dict[str, Any]) -> None:
    raw = orjson.dumps(body)
    assert estimate(ANTHROPIC, body) <= len(raw) + BYTE_BOUND_SLACK


@settings(max_examples=400, deadline=None)
@given(chat_bodies())
def test_chat_estimate_is_within_bytes_plus_slack(body: dict[str, Any]) -> None:
    raw = orjson.dumps(body)
    assert estimate(CHAT, body) <= len(raw) + BYTE_BOUND_SLACK


def test_recorded_agent_requests_are_within_the_bound() -> None:
    for path in sorted(AGENT.glob("*.json")):
        body = json.loads(path.read_text())["body"]
        assert estimate(ANTHROPIC, body) <= len(orjson.dumps(body)) + BYTE_BOUND_SLACK


def test_the_shortcut_never_clears_a_body_over_the_trigger() -> None:
    policy = Policy(window=10_000, trigger=5_000, target=2_000)
    body = {
        "model": "m",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "word " * 8_000}],
    }
    raw = orjson.dumps(body)
    assert estimate(ANTHROPIC, body) > policy.trigger_tokens
    assert not cannot_cross(raw, policy, 1.0)
    image = {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
    small = orjson.dumps({"messages": [{"role": "user", "content": [image]}]})
    assert not cannot_cross(small, policy, 1.0), "images and documents are always counted"


def test_the_shortcut_never_clears_a_body_over_the_offload_threshold() -> None:
    """Offloading starts below the trigger (offload_trigger, and summaries are made
    ahead before it): a body between them must be counted, not waved through."""
    policy = Policy(window=100_000, trigger=70_000, target=30_000, offload_trigger=10_000)
    assert policy.quiet_tokens == 10_000
    body = {
        "model": "m",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "word " * 12_000}],
    }
    assert policy.offload_tokens < estimate(ANTHROPIC, body) < policy.trigger_tokens
    assert not cannot_cross(orjson.dumps(body), policy, 1.0)
    short = orjson.dumps({"messages": [{"role": "user", "content": "word " * 1_000}]})
    assert cannot_cross(short, policy, 1.0)
