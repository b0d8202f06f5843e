"""The rewrite planner on OpenAI Chat histories: the same guarantees through the dialect."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.checkpoint import Checkpoint
from proxy.core.digests import message_digest
from proxy.core.outcome import FoldPlan, Refuse, Rewrite, Untouched
from proxy.core.planner import plan
from proxy.core.policy import Policy
from proxy.core.rewrites import fold
from proxy.core.tokens import TokenCounter
from proxy.core.working import PlanInput
from proxy.wire.chat import CHAT, ChatCounter, read_result_tool
from proxy.wire.chat_validation import validate_chat_request

COUNTER = ChatCounter(TokenCounter())
TOOL_TOKENS = COUNTER.count_tools([read_result_tool("read_result")])
FIXED = 500


def policy(**kw: Any) -> Policy:
    base: dict[str, Any] = dict(
        window=20_000,
        trigger=8_000,
        target=4_000,
        keep_last=2,
        keep_results=1,
        offload_threshold=300,
        stub_head_chars=200,
        note_cost=60,
        offload_trigger=8_000,  # offload only when folding is due (incremental: test_offload_steps)
    )
    base.update(kw)
    return Policy(**base).validate()


def words(n: int, seed: str) -> str:
    return " ".join(f"{seed}{i % 97}" for i in range(n))


def call(i: str) -> dict[str, Any]:
    return {"id": i, "type": "function", "function": {"name": "Read", "arguments": '{"p": 1}'}}


def conversation(turns: int, result_words: int = 400) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test in src/app.py"},
    ]
    for t in range(turns):
        messages.append(
            {"role": "assistant", "content": f"Step {t}", "tool_calls": [call(f"c{t}")]}
        )
        messages.append(
            {"role": "tool", "tool_call_id": f"c{t}", "content": words(result_words, f"w{t}_")}
        )
    return messages


def planned(messages: list[dict[str, Any]], checkpoint: Checkpoint | None = None, **kw: Any):
    inp = PlanInput(
        messages=messages,
        digests=[message_digest(m) for m in messages],
        counts=[COUNTER.count_message(m) for m in messages],
        checkpoint=checkpoint,
        policy=kw.pop("policy", policy()),
        counter=COUNTER,
        fixed_tokens=FIXED,
        tool_tokens=TOOL_TOKENS,
        tool=kw.pop("tool", "read_result"),
        store_ok=kw.pop("store_ok", True),
        dialect=CHAT,
    )
    return plan(inp)


def invalid(messages: list[dict[str, Any]]) -> str | None:
    error = validate_chat_request({"model": "gpt-test", "messages": messages})
    return error.message if error else None


def test_crossing_stubs_tool_messages_and_the_checkpoint_holds() -> None:
    messages = conversation(12)
    out = planned(messages, policy=policy(target=5_000))
    assert isinstance(out, Rewrite) and out.strategy == "offload"
    assert len(out.blobs) == 11
    stub = out.messages[3]
    assert stub["role"] == "tool" and stub["tool_call_id"] == "c0"
    assert f'read_result(ref="{out.blobs[0][0]}", start=' in stub["content"]
    assert out.messages[-1] == messages[-1]
    assert invalid(out.messages) is None
    grown = [
        *messages,
        {"role": "assistant", "content": None, "tool_calls": [call("cx")]},
        {"role": "tool", "tool_call_id": "cx", "content": words(300, "new")},
    ]
    again = planned(grown, out.checkpoint, policy=policy(target=5_000))
    assert isinstance(again, Rewrite) and again.strategy == "checkpoint"
    assert orjson.dumps(again.messages[: len(out.messages)]) == orjson.dumps(out.messages)


def test_folding_writes_a_user_summary_after_the_system_prompt() -> None:
    messages = conversation(30, result_words=150)
    out = planned(messages, policy=policy(offload_threshold=100_000))
    assert isinstance(out, FoldPlan)
    assert "[tool call Read id=c0]" in out.transcript and "## tool" in out.transcript
    done = fold(out, "notes about src/app.py", summary="made")
    assert isinstance(done, Rewrite) and done.strategy == "summary"
    assert done.messages[0] == messages[0], "the system prompt stays first"
    summary = next(m for m in done.messages if "notes about src/app.py" in str(m["content"]))
    assert summary["role"] == "user" and isinstance(summary["content"], str)
    assert invalid(done.messages) is None


# -- properties ------------------------------------------------------------------------


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "task"},
    ]
    for t in range(draw(st.integers(0, 30))):
        kind = draw(st.sampled_from(["tool", "tool", "tool", "chat", "developer"]))
        if kind == "tool":
            ids = [f"c{t}_{k}" for k in range(draw(st.integers(1, 2)))]
            text = draw(st.sampled_from([None, "looking"]))
            messages.append(
                {"role": "assistant", "content": text, "tool_calls": [call(i) for i in ids]}
            )
            for i in ids:
                content: Any = words(draw(st.integers(5, 900)), i)
                if draw(st.booleans()):
                    content = [{"type": "text", "text": content}]
                messages.append({"role": "tool", "tool_call_id": i, "content": content})
        elif kind == "chat":
            messages.append({"role": "assistant", "content": words(draw(st.integers(1, 200)), "a")})
            messages.append({"role": "user", "content": words(draw(st.integers(1, 200)), "u")})
        else:
            messages.append({"role": "developer", "content": "reminder"})
    return messages


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.booleans(), st.booleans())
def test_every_chat_rewrite_is_valid_fits_and_is_deterministic(
    messages: list[dict[str, Any]], summarise: bool, store_ok: bool
) -> None:
    limits = policy()

    def run() -> Untouched | Rewrite | Refuse:
        out = planned(messages, store_ok=store_ok)
        if isinstance(out, FoldPlan):
            return fold(out, "notes: " + out.key if summarise else None, summary="made")
        return out

    out = run()
    if isinstance(out, Untouched):
        assert sum(COUNTER.count_message(m) for m in messages) <= limits.trigger_tokens
        return
    if isinstance(out, Refuse):
        return
    assert invalid(out.messages) is None
    assert out.messages[-1] == messages[-1]
    assert out.tokens_after <= limits.window - FIXED - TOOL_TOKENS
    pinned = [m for m in messages if m["role"] in ("system", "developer")]
    assert all(m in out.messages for m in pinned), "system and developer messages are kept"
    for m in out.messages:
        if m["role"] == "tool" and m not in messages:
            assert "read_result(ref=" in str(m["content"]), "a changed tool message is a stub"
    again = run()
    assert isinstance(again, Rewrite)
    assert orjson.dumps(again.messages) == orjson.dumps(out.messages)
