"""Validating only what is new (proxy/core/validated.py) answers what the full validation
answers: a line's requests validated with one memo, each compared with its validation in
full, over growing, rewound, forked and edited histories that share message objects as a
conversation line's requests do (the reuse cache hands them on; a rewrite replaces some).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.reuse import Reuse
from proxy.core.validated import CHAINS, Validated
from proxy.wire import ANTHROPIC
from proxy.wire.anthropic_validation import thinking_signature, validate_messages_request

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from fresh_session import FreshSessions

IDS = [f"toolu_{n}" for n in range(6)]  # few: ids repeat, results answer the wrong call
MARK = {"type": "ephemeral"}
TOOLS = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]


def _text(value: str, marked: bool = False) -> dict[str, Any]:
    return {"type": "text", "text": value, **({"cache_control": MARK} if marked else {})}


@st.composite
def _block(draw: st.DrawFn, role: str) -> dict[str, Any]:
    """A block, most often one the role may hold, now and then one it may not."""
    kind = draw(st.sampled_from(["text", "text", "use", "result", "thinking", "odd"]))
    marked = draw(st.integers(0, 5)) == 0
    if kind == "text":
        return _text(draw(st.sampled_from(["ok", "go on", " ", "", "done "])), marked)
    if kind == "use":
        tool_id = draw(st.sampled_from(IDS))
        return {"type": "tool_use", "id": tool_id, "name": "Bash", "input": {}}
    if kind == "result":
        inner: Any = draw(st.sampled_from(["a.txt", [_text("x", marked)], [_text("")], None]))
        block = {"type": "tool_result", "tool_use_id": draw(st.sampled_from(IDS))}
        return block if inner is None else {**block, "content": inner}
    if kind == "thinking":
        said = draw(st.sampled_from(["plan", "other"]))
        return {"type": "thinking", "thinking": said, "signature": thinking_signature("plan")}
    return draw(st.sampled_from([{"type": "image"}, {"text": "no type"}, "not a block"]))


@st.composite
def _noise(draw: st.DrawFn) -> Any:
    """Any message: roles, contents and blocks the rules may refuse."""
    role = draw(st.sampled_from(["user", "assistant", "system", "tool"]))
    if draw(st.integers(0, 3)) == 0:
        return {"role": role, "content": draw(st.sampled_from(["hi", "", " ", "end "]))}
    return {"role": role, "content": draw(st.lists(_block(role), max_size=3))}


@st.composite
def _turn(draw: st.DrawFn, history: list[Any]) -> list[Any]:
    """The next messages of a well-formed conversation after `history` (most of the time),
    or a message drawn from anything (`_noise`)."""
    if draw(st.integers(0, 11)) == 0:
        return [draw(_noise())]
    roles = [m.get("role") for m in history if isinstance(m, dict)]
    last = next((r for r in reversed(roles) if r in ("user", "assistant")), None)
    if last == "assistant":
        calls = [
            b["id"]
            for b in history[-1].get("content", [])
            if isinstance(history[-1], dict) and isinstance(b, dict) and b.get("type") == "tool_use"
        ]
        results: list[dict[str, Any]] = [
            {"type": "tool_result", "tool_use_id": c, "content": "out"} for c in calls
        ]
        if results and draw(st.integers(0, 3)) == 0:
            results[-1]["cache_control"] = MARK
        tail = [_text("next")] if not results or draw(st.booleans()) else []
        if results and draw(st.integers(0, 5)) == 0:  # a result not right after its call
            return [{"role": "user", "content": [_text("wait"), *results]}]
        if len(results) > 1 and draw(st.booleans()):  # split over two user messages
            return [
                {"role": "user", "content": results[:1]},
                {"role": "user", "content": results[1:] + tail},
            ]
        return [{"role": "user", "content": results + tail}]
    out: list[Any] = []
    if draw(st.integers(0, 4)) == 0:
        out.append({"role": "system", "content": "note"})
    taken = {
        b.get("id")
        for m in history
        if isinstance(m, dict) and isinstance(m.get("content"), list)
        for b in m["content"]
        if isinstance(b, dict)
    }
    free = [i for i in IDS if i not in taken or draw(st.integers(0, 3)) == 0]  # now and then
    calls = draw(st.lists(st.sampled_from(free), max_size=2, unique=True)) if free else []
    said = draw(st.sampled_from(["plan", "plan", "edited"]))  # edited: a bad signature
    signed = {"type": "thinking", "thinking": said, "signature": thinking_signature("plan")}
    thinking = [] if draw(st.booleans()) else [signed]
    ending = draw(st.sampled_from(["Running.", "Running.", "done "]))  # a prefill's rule
    blocks = [*thinking, _text(ending, marked=draw(st.integers(0, 3)) == 0)]
    blocks += [{"type": "tool_use", "id": c, "name": "Bash", "input": {}} for c in calls]
    out.append({"role": "assistant", "content": blocks})
    if draw(st.integers(0, 3)):  # answered in the same request, as agents send it
        out += draw(_turn([*history, *out]))
    return out


def _edited(message: Any, draw: st.DrawFn) -> Any:
    """A new object for a message, as a rewrite makes: a tool result's content stubbed, or
    a breakpoint added, or a copy."""
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return copy.copy(message)
    blocks = list(message["content"])
    if blocks and isinstance(blocks[-1], dict) and draw(st.booleans()):
        blocks[-1] = {**blocks[-1], "cache_control": MARK}
    stubbed = [
        {**b, "content": "[stubbed]"}
        if isinstance(b, dict) and b.get("type") == "tool_result"
        else b
        for b in blocks
    ]
    return {**message, "content": stubbed}


@st.composite
def _line(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A line's requests: each grows, rewinds, forks from or edits an earlier one, sharing
    its message objects."""
    histories: list[list[Any]] = [[{"role": "user", "content": "start"}]]  # (not sent)
    for _ in range(draw(st.integers(1, 12))):
        base = draw(st.sampled_from(histories[-3:]))
        how = draw(st.sampled_from(["grow", "grow", "grow", "rewind", "edit", "tail"]))
        if how == "rewind":
            base = base[: draw(st.integers(0, len(base)))]
        elif how == "edit" and base:
            at = draw(st.integers(0, len(base) - 1))
            base = [*base[:at], _edited(base[at], draw), *base[at + 1 :]]
        elif how == "tail" and base:  # the client's marker moved off its last message
            base = [*base[:-1], _edited(base[-1], draw)]
        grown = [] if how == "rewind" and draw(st.booleans()) else draw(_turn(base))
        histories.append([*base, *grown])
    # The same objects from request to request, now and then ones the rules refuse.
    marked = [{**TOOLS[0], "cache_control": MARK}]
    tools = [TOOLS, TOOLS, TOOLS, marked, None, [*TOOLS, TOOLS[0]]]
    system = [_text("You are Claude.", marked=True)]
    systems = [system, system, system, None, "Be brief.", [{"type": "image"}]]
    bodies = []
    for messages in histories[1:]:
        body: dict[str, Any] = {
            "model": "claude-sonnet-4-5",
            "max_tokens": 4096,
            "messages": messages,
        }
        tool = draw(st.sampled_from(tools))
        system = draw(st.sampled_from(systems))
        if tool is not None:
            body["tools"] = tool
        if system is not None:
            body["system"] = system
        if draw(st.integers(0, 3)) == 0:
            body["thinking"] = {"type": "enabled", "budget_tokens": 1024}
        if draw(st.integers(0, 5)) == 0:
            body["cache_control"] = MARK
        bodies.append(body)
    return bodies


@settings(max_examples=400, deadline=None)
@given(_line())
def test_a_lines_requests_validated_with_a_memo_answer_as_in_full(
    bodies: list[dict[str, Any]],
) -> None:
    memo = Validated()
    for body in bodies:
        full = validate_messages_request(copy.deepcopy(body))
        before = list(memo.chains)
        assert validate_messages_request(body, memo) == full
        assert len(memo.chains) <= CHAINS
        # Found valid by the walk itself (its history kept), not by the full validation.
        walked = bool(memo.chains) and all(memo.chains[-1] is not c for c in before)
        if walked:
            assert memo.chains[-1].messages == body["messages"]
        assert walked == (full is None)


@settings(max_examples=100, deadline=None)
@given(_line())
def test_the_wire_answers_with_the_memo_as_without(bodies: list[dict[str, Any]]) -> None:
    memo = Validated()
    for body in bodies:
        assert ANTHROPIC.request_error(body, "", memo) == ANTHROPIC.request_error(body, "")


def test_a_recorded_session_walks_only_its_new_messages() -> None:
    """Claude Code's requests through the reuse cache (each repeats the last one's message
    objects but its newest): each found valid, walking only the messages the line's last
    request did not hold."""
    reuse = Reuse(max_bytes=1 << 30)
    walked = []
    for recorded in FreshSessions().recorded:
        body, seen = reuse.parse("line", recorded.body, "messages")
        assert seen is not None
        messages = body["messages"]
        shared, _ = seen.validated.resume(messages)
        walked.append(len(messages) - shared)
        assert validate_messages_request(body, seen.validated) is None
    assert len(walked) >= 40
    # The first request walks all; then the new messages (a call and its result) and the
    # one whose cache marker moved.
    assert max(walked[1:]) <= 4, walked
