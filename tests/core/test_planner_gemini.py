"""The rewrite planner on Gemini contents: the same guarantees through the dialect, every
rewrite checked by the API's rules as the stand-in holds them (proxy/wire/gemini_validation)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy.core.checkpoint import Checkpoint
from proxy.core.digests import message_digest
from proxy.core.outcome import FoldPlan, Refuse, Rewrite, Untouched
from proxy.core.planner import plan
from proxy.core.policy import Policy
from proxy.core.rewrites import fold
from proxy.core.tokens import TokenCounter
from proxy.core.working import PlanInput
from proxy.wire.gemini import GEMINI, read_result_tool
from proxy.wire.gemini_parts import GeminiCounter
from proxy.wire.gemini_validation import check_request

COUNTER = GeminiCounter(TokenCounter())
TOOL_TOKENS = COUNTER.count_tools([read_result_tool("read_result")])
FIXED = 500
MODEL = "gemini-3-flash-preview"
TOOLS = [{"functionDeclarations": [{"name": "run_shell_command", "description": "Run."}]}]


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
        offload_trigger=8_000,
    )
    base.update(kw)
    return Policy(**base).validate()


def words(n: int, seed: str) -> str:
    return " ".join(f"{seed}{i % 97}" for i in range(n))


def call(command: str, signature: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"functionCall": {"name": "run_shell_command", "args": {"c": command}}}
    if signature is not None:
        part["thoughtSignature"] = signature
    return part


def answer(output: str) -> dict[str, Any]:
    return {"functionResponse": {"name": "run_shell_command", "response": {"output": output}}}


def conversation(turns: int, result_words: int = 400) -> list[dict[str, Any]]:
    contents: list[dict[str, Any]] = [
        {"role": "user", "parts": [{"text": "Fix the failing test in src/app.py"}]}
    ]
    for t in range(turns):
        contents.append(
            {"role": "model", "parts": [{"text": f"Step {t}"}, call(f"ls {t}", "c2ln")]}
        )
        contents.append({"role": "user", "parts": [answer(words(result_words, f"w{t}_"))]})
    return contents


def planned(contents: list[dict[str, Any]], checkpoint: Checkpoint | None = None, **kw: Any):
    inp = PlanInput(
        messages=contents,
        digests=[message_digest(m) for m in contents],
        counts=[COUNTER.count_message(m) for m in contents],
        checkpoint=checkpoint,
        policy=kw.pop("policy", policy()),
        counter=COUNTER,
        fixed_tokens=FIXED,
        tool_tokens=TOOL_TOKENS,
        tool=kw.pop("tool", "read_result"),
        store_ok=kw.pop("store_ok", True),
        dialect=GEMINI,
    )
    return plan(inp)


def invalid(contents: list[dict[str, Any]], tool: str | None = "read_result") -> str | None:
    body = {"contents": contents, "tools": TOOLS}
    sent = {**body, **GEMINI.with_history(body, contents, tool)}
    found = check_request(sent, MODEL)
    return found.message if found else None


def test_a_crossing_stubs_function_responses_and_the_checkpoint_holds() -> None:
    contents = conversation(12)
    out = planned(contents, policy=policy(target=5_000))
    assert isinstance(out, Rewrite) and out.strategy == "offload"
    assert len(out.blobs) == 11
    stubbed = out.messages[2]
    response = stubbed["parts"][0]["functionResponse"]
    assert response["name"] == "run_shell_command"
    assert f'read_result(ref="{out.blobs[0][0]}", start=' in response["response"]["output"]
    assert out.messages[1] == contents[1], "the model turn and its signature are kept as sent"
    assert out.messages[-1] == contents[-1]
    assert invalid(out.messages) is None
    grown = [
        *contents,
        {"role": "model", "parts": [call("cat x", "c2ln")]},
        {"role": "user", "parts": [answer(words(300, "new"))]},
    ]
    again = planned(grown, out.checkpoint, policy=policy(target=5_000))
    assert isinstance(again, Rewrite) and again.strategy == "checkpoint"
    assert orjson.dumps(again.messages[: len(out.messages)]) == orjson.dumps(out.messages)


def test_folding_writes_a_user_summary_and_the_calls_stay_after_a_user_turn() -> None:
    contents = conversation(30, result_words=150)
    out = planned(contents, policy=policy(offload_threshold=100_000))
    assert isinstance(out, FoldPlan)
    assert "[function call run_shell_command]" in out.transcript
    assert "[function response run_shell_command]" in out.transcript
    done = fold(out, "notes about src/app.py", summary="made")
    assert isinstance(done, Rewrite) and done.strategy == "summary"
    assert done.messages[0] == contents[0], "the task (the last user text) is pinned"
    summary = done.messages[1]
    assert summary["role"] == "user" and "notes about src/app.py" in summary["parts"][0]["text"]
    assert invalid(done.messages) is None


# -- properties ------------------------------------------------------------------------


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": "task"}]}]
    for t in range(draw(st.integers(0, 30))):
        kind = draw(st.sampled_from(["tool", "tool", "tool", "chat", "thought"]))
        if kind in ("tool", "thought"):
            calls = [call(f"c{t}_{k}") for k in range(draw(st.integers(1, 2)))]
            calls[0]["thoughtSignature"] = f"c2ln{t}"
            lead = [{"text": "looking"}] if draw(st.booleans()) else []
            contents.append({"role": "model", "parts": [*lead, *calls]})
            parts = [answer(words(draw(st.integers(5, 900)), f"r{t}")) for _ in calls]
            if draw(st.booleans()):
                parts.append({"text": "a user note beside the responses"})
            contents.append({"role": "user", "parts": parts})
        else:
            contents.append(
                {"role": "model", "parts": [{"text": words(draw(st.integers(1, 200)), "a")}]}
            )
            contents.append(
                {"role": "user", "parts": [{"text": words(draw(st.integers(1, 200)), "u")}]}
            )
    return contents


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.booleans(), st.booleans())
def test_every_gemini_rewrite_is_valid_fits_and_is_deterministic(
    contents: list[dict[str, Any]], summarise: bool, store_ok: bool
) -> None:
    assert invalid(contents, None) is None
    limits = policy()

    def run() -> Untouched | Rewrite | Refuse:
        out = planned(contents, store_ok=store_ok)
        if isinstance(out, FoldPlan):
            return fold(out, "notes: " + out.key if summarise else None, summary="made")
        return out

    out = run()
    event(f"{out.strategy} {out.reason}" if isinstance(out, Rewrite) else type(out).__name__)
    if isinstance(out, Untouched):
        assert sum(COUNTER.count_message(m) for m in contents) <= limits.trigger_tokens
        return
    if isinstance(out, Refuse):
        return
    assert invalid(out.messages, out.tool) is None
    assert out.messages[-1] == contents[-1]
    assert out.tokens_after <= limits.window - FIXED - TOOL_TOKENS
    for m in out.messages:
        if m["role"] == "model":
            assert m in contents, "model turns (and their signatures) are never changed"
    again = run()
    assert isinstance(again, Rewrite)
    assert orjson.dumps(again.messages) == orjson.dumps(out.messages)
