"""Work in proportion to what is new changes nothing that goes upstream: a conversation's
requests parsed and counted through the reuse cache (proxy/core/reuse.py) give the same
decisions and the same bytes upstream as the full path, over histories that grow, move
their cache marker, rewind and fork, in Messages, Chat and Responses. Both run the
server's driver (proxy/core/driver.py) through the simulator, each with its own counter
and store, over a small policy so that requests offload, fold and pack."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.policy import Policy
from proxy.core.reuse import Reuse
from proxy.core.tokens import TokenCounter
from proxy.core.wire_format import WireFormat
from proxy.ops.simulate import Simulator
from proxy.wire import ANTHROPIC, CHAT, RESPONSES

POLICY = Policy(match="*", window=20_000, trigger=6_000, target=4_000, offload_trigger=1_500)
WORDS = ["build", "cache", "token", "result", "error", "module", "request", "value", "stream"]


def _text(seed: int, words: int) -> str:
    return " ".join(WORDS[(seed * 7 + k * k) % len(WORDS)] + str(k % 13) for k in range(words))


# A turn: (its number, the size of its tool result in words, whether it calls a tool).
Turn = tuple[int, int, bool]


def _messages(turns: list[Turn], marker: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "Go."}]}]
    for n, size, tool in turns:
        call = f"toolu_{n:04d}"
        if tool:
            use = {"type": "tool_use", "id": call, "name": "Bash", "input": {"command": f"s {n}"}}
            result = {"type": "tool_result", "tool_use_id": call, "content": _text(n, size)}
            out += [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
        else:
            out += [
                {"role": "assistant", "content": [{"type": "text", "text": _text(n, 20)}]},
                {"role": "user", "content": [{"type": "text", "text": _text(n + 1, size)}]},
            ]
    if marker:  # as Claude Code does: on the newest block only
        last = out[-1]["content"][-1]
        out[-1] = {**out[-1], "content": [{**last, "cache_control": {"type": "ephemeral"}}]}
    return out


def _messages_body(turns: list[Turn], marker: bool) -> dict[str, Any]:
    return {
        "model": "claude-test",
        "messages": _messages(turns, marker),
        "system": [{"type": "text", "text": "You are a coding agent."}],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
        "max_tokens": 1000,
    }


def _chat_body(turns: list[Turn], marker: bool) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Go."},
    ]
    for n, size, tool in turns:
        if tool:
            arguments = orjson.dumps({"n": n}).decode()
            call = {"id": f"call_{n}", "type": "function",
                    "function": {"name": "sh", "arguments": arguments}}  # fmt: skip
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            messages.append(
                {"role": "tool", "tool_call_id": f"call_{n}", "content": _text(n, size)}
            )
        else:
            messages.append({"role": "assistant", "content": _text(n, 20)})
            messages.append({"role": "user", "content": _text(n + 1, size)})
    tools = [{"type": "function", "function": {"name": "sh", "parameters": {"type": "object"}}}]
    return {"model": "gpt-test", "messages": messages, "tools": tools, "stream": marker}


def _responses_body(turns: list[Turn], marker: bool) -> dict[str, Any]:
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Go."}]
    for n, size, tool in turns:
        if tool:
            items.append({"type": "function_call", "call_id": f"call_{n}", "name": "sh",
                          "arguments": orjson.dumps({"n": n}).decode()})  # fmt: skip
            items.append(
                {"type": "function_call_output", "call_id": f"call_{n}", "output": _text(n, size)}
            )
        else:
            items.append({"type": "message", "role": "assistant",
                          "content": [{"type": "output_text", "text": _text(n, 20)}]})  # fmt: skip
            items.append({"type": "message", "role": "user", "content": _text(n + 1, size)})
    tools = [{"type": "function", "name": "sh", "parameters": {"type": "object"}}]
    return {"model": "gpt-test", "input": items, "tools": tools, "store": marker}


FORMATS: dict[str, tuple[WireFormat, Callable[[list[Turn], bool], dict[str, Any]]]] = {
    "messages": (ANTHROPIC, _messages_body),
    "chat": (CHAT, _chat_body),
    "responses": (RESPONSES, _responses_body),
}

edits = st.lists(
    st.tuples(
        st.sampled_from(["grow", "grow", "grow", "rewind", "fork", "resend", "unmark"]),
        st.integers(1, 4),
        st.integers(10, 400),
        st.booleans(),
    ),
    min_size=3,
    max_size=16,
)


def _check(fmt: str, steps: list[tuple[str, int, int, bool]]) -> tuple[set[str], int]:
    """The strategies the line's requests took (both paths alike), and the reuse hits."""
    wire, build = FORMATS[fmt]
    full = Simulator([POLICY], TokenCounter(), fmt=wire)
    reusing = Simulator([POLICY], TokenCounter(), fmt=wire)
    reuse = Reuse(1 << 30, lines_per_key=3)
    turns: list[Turn] = []
    made = 0
    strategies = set()
    for edit, k, size, tool in steps:
        marker = True
        if edit == "grow":
            turns = [*turns, *((made + j, size + 37 * j, tool or j % 2 == 0) for j in range(k))]
            made += k
        elif edit == "rewind":
            turns = turns[: max(0, len(turns) - k)]
        elif edit == "fork":
            turns = [*turns[: max(0, len(turns) - k)], (made + 1000, size, tool)]
            made += 1
        elif edit == "unmark":
            marker = False
        raw = orjson.dumps(build(turns, marker))
        expected = full.step(orjson.loads(raw))
        payload, seen = reuse.parse("conversation", raw, wire.history_field)
        assert payload == orjson.loads(raw)
        got = reusing.step(payload, seen)
        assert orjson.dumps(got.body) == orjson.dumps(expected.body)
        # The bytes encoded for upstream too (written in parts the line's last rewrite
        # held, on the reuse path: exact_json.ClientJSON.encode_kept).
        assert got.encoded == expected.encoded
        assert (got.kind, got.strategy, got.tokens_before, got.tokens_after) == (
            expected.kind,
            expected.strategy,
            expected.tokens_before,
            expected.tokens_after,
        )
        strategies.add(expected.strategy.value if expected.strategy else expected.kind)
    return strategies, reuse.stats.hits


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(FORMATS)), edits)
def test_the_reuse_path_sends_what_the_full_path_sends(
    fmt: str, steps: list[tuple[str, int, int, bool]]
) -> None:
    _check(fmt, steps)


def test_a_long_line_of_each_format_offloads_and_folds_the_same() -> None:
    for fmt in FORMATS:
        _check(
            fmt, [("grow", 2, 300, True)] * 12 + [("rewind", 3, 0, True), ("grow", 3, 250, True)]
        )
