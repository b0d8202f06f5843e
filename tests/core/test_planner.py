"""The rewrite planner: untouched, offload, fold, pack, refuse, and stable checkpoints."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.checkpoint import Checkpoint
from proxy.core.digests import message_digest
from proxy.core.outcome import FoldPlan, Refuse, Rewrite, Untouched
from proxy.core.planner import plan
from proxy.core.policy import Policy
from proxy.core.rewrites import fold
from proxy.core.summariser_input import MIN_SUMMARY_TOKENS
from proxy.core.tokens import TokenCounter
from proxy.core.working import DEFER_SHARE, PlanInput
from proxy.wire import ANTHROPIC, RESPONSES
from proxy.wire.anthropic import read_result_tool
from proxy.wire.responses_validation import validate_responses_request
from tests.wire.test_anthropic_history import _pairing_errors

COUNTER = TokenCounter()
TOOL_TOKENS = COUNTER.count_tools([read_result_tool("read_result")])


def policy(**kw: Any) -> Policy:
    base = dict(
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


NO_OFFLOAD = policy(offload_threshold=100_000)


def words(n: int, seed: str) -> str:
    return " ".join(f"{seed}{i % 97}" for i in range(n))


def conversation(turns: int, result_words: int = 400) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Fix the failing test in src/app.py"}
    ]
    for t in range(turns):
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Step {t}: reading."},
                    {
                        "type": "tool_use",
                        "id": f"toolu_{t:04d}",
                        "name": "Bash",
                        "input": {"command": f"cat f{t}.log"},
                    },
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": f"toolu_{t:04d}",
                        "content": words(result_words, f"w{t}_"),
                    },
                ],
            }
        )
    return messages


def plan_input(
    messages: list[dict[str, Any]], checkpoint: Checkpoint | None = None, **kw: Any
) -> PlanInput:
    return PlanInput(
        messages=messages,
        digests=[message_digest(m) for m in messages],
        counts=[COUNTER.count_message(m) for m in messages],
        checkpoint=checkpoint,
        policy=kw.pop("policy", policy()),
        counter=COUNTER,
        fixed_tokens=kw.pop("fixed", 500),
        tool_tokens=TOOL_TOKENS,
        tool=kw.pop("tool", "read_result"),
        factor=kw.pop("factor", 1.0),
        store_ok=kw.pop("store_ok", True),
        dialect=ANTHROPIC,
    )


def planned(messages: list[dict[str, Any]], checkpoint: Checkpoint | None = None, **kw: Any):
    return plan(plan_input(messages, checkpoint, **kw))


def history_tokens(messages: list[dict[str, Any]]) -> int:
    return sum(COUNTER.count_message(m) for m in messages)


def test_a_history_under_the_trigger_is_untouched() -> None:
    assert isinstance(planned(conversation(3)), Untouched)


def test_crossing_offloads_all_but_the_newest_results() -> None:
    messages = conversation(12)
    out = planned(messages, policy=policy(target=5_000))
    assert isinstance(out, Rewrite) and out.strategy == "offload"
    assert out.tool == "read_result"
    assert len(out.blobs) == 11 and len(out.refs) == 11
    newest = out.messages[-1]["content"][0]["content"]
    assert newest == messages[-1]["content"][0]["content"], "the newest result was offloaded"
    stub = out.messages[2]["content"][0]["content"]
    ref, text = out.blobs[0]
    assert f'read_result(ref="{ref}", start=' in stub and stub.startswith(text[:150])
    assert out.tokens_after <= 5_000 < out.tokens_before
    assert _pairing_errors(out.messages) == []


def test_the_checkpoint_is_reapplied_byte_for_byte() -> None:
    messages = conversation(12)
    first = planned(messages, policy=policy(target=5_000))
    assert isinstance(first, Rewrite) and first.checkpoint is not None
    grown = [
        *messages,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_x", "name": "Bash", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_x", "content": words(300, "new")}
            ],
        },
    ]
    # Agents move cache_control to their newest message every turn: the prefix still matches.
    grown[-1]["content"][0]["cache_control"] = {"type": "ephemeral"}
    again = planned(grown, first.checkpoint, policy=policy(target=5_000))
    assert isinstance(again, Rewrite) and again.strategy == "checkpoint"
    assert again.checkpoint is None, "nothing new to store between crossings"
    prefix = orjson.dumps(first.messages)
    assert orjson.dumps(again.messages[: len(first.messages)]) == prefix
    assert again.messages[len(first.messages) :] == grown[len(messages) :]


def test_an_edited_history_does_not_take_a_stale_checkpoint() -> None:
    messages = conversation(12)
    first = planned(messages, policy=policy(target=5_000))
    assert isinstance(first, Rewrite)
    edited = [dict(m) for m in messages]
    edited[0] = {"role": "user", "content": "A different task"}
    out = planned(edited, first.checkpoint, policy=policy(target=5_000))
    assert isinstance(out, Rewrite) and out.strategy == "offload"
    assert out.messages[0]["content"] == "A different task"


def test_over_target_after_offload_asks_for_a_summary_then_folds() -> None:
    messages = conversation(30, result_words=150)
    out = planned(messages, policy=NO_OFFLOAD)
    assert isinstance(out, FoldPlan)
    assert out.summary_tokens > 0 and "toolu_0000" in out.transcript
    done = fold(out, "Goal: fix src/app.py. Tried toolu_0000.", summary="made")
    assert isinstance(done, Rewrite) and done.summary == "made"
    assert done.messages[0] == messages[0], "the task (last user message) is pinned"
    summary = done.messages[1]["content"][0]["text"]
    assert summary.startswith("[compaction-proxy: summary of ") and "src/app.py" in summary
    assert done.messages[-4:] == messages[-4:], "keep_last groups stay verbatim"
    assert done.tokens_after <= 4_000 + out.summary_tokens
    assert _pairing_errors(done.messages) == []


def test_a_fold_with_little_room_asks_for_a_summary_every_api_takes() -> None:
    """The newest turns kept leave a fold a few tokens of room: its summariser call still
    asks for an output cap the APIs take (the battery found Responses summaries refused
    for max_output_tokens 12-14: the API's least is 16)."""
    caps = set()
    for n in range(1280, 1340):  # the newest result's words: the room goes down to a few
        messages = conversation(12, result_words=150)
        messages[-1]["content"][0]["content"] = words(n, "z")
        out = planned(messages, policy=NO_OFFLOAD)
        if isinstance(out, FoldPlan):
            caps.add(out.summary_tokens)
    assert len(caps) > 10 and min(caps) == MIN_SUMMARY_TOKENS
    history = [{"type": "message", "role": "user", "content": "hi"}]
    for in_place in (None, history):
        asked = RESPONSES.summary_request(
            {"model": "gpt-5-codex", "input": history},
            model="gpt-5-codex",
            summary_tokens=min(caps),
            prompt="Summarise.",
            history=in_place,
        )
        assert validate_responses_request(asked, openai=True) is None


def test_a_second_crossing_folds_the_earlier_summary_first() -> None:
    messages = conversation(30, result_words=150)
    need = planned(messages, policy=NO_OFFLOAD)
    assert isinstance(need, FoldPlan)
    first = fold(need, "first summary", summary="made")
    assert isinstance(first, Rewrite)
    longer = conversation(60, result_words=150)
    need2 = planned(longer, first.checkpoint, policy=NO_OFFLOAD)
    assert isinstance(need2, FoldPlan)
    assert need2.transcript.index("first summary") < need2.transcript.index("toolu_0030")
    second = fold(need2, "second summary", summary="made")
    assert isinstance(second, Rewrite)
    texts = orjson.dumps(second.messages).decode()
    assert "second summary" in texts and "first summary" not in texts


def test_no_summary_falls_back_to_packing_with_a_note() -> None:
    messages = conversation(30, result_words=150)
    need = planned(messages, policy=NO_OFFLOAD)
    assert isinstance(need, FoldPlan)
    packed = fold(need, None, summary="made")
    assert isinstance(packed, Rewrite) and packed.strategy == "pack"
    note = packed.messages[1]["content"][0]["text"]
    assert "earlier messages were dropped" in note
    assert packed.tokens_after <= 4_000
    assert _pairing_errors(packed.messages) == []


def test_without_a_store_it_packs_and_offloads_nothing() -> None:
    out = planned(conversation(12), store_ok=False)
    assert isinstance(out, Rewrite) and out.strategy == "pack" and not out.blobs
    assert out.tool is None
    assert out.checkpoint is None  # planned without the stored line: never saved over it


def test_a_taken_tool_name_turns_offload_off() -> None:
    out = planned(conversation(12), tool=None)
    assert isinstance(out, (Rewrite, FoldPlan))
    if isinstance(out, Rewrite):
        assert not out.blobs and out.tool is None


def test_nothing_fits_is_refused_with_the_numbers() -> None:
    messages = [{"role": "user", "content": words(30_000, "huge")}]
    out = planned(messages)
    assert isinstance(out, Refuse)
    assert "window" in out.message and "more than the 20000-token window" in out.message


def test_calibration_scales_the_policy() -> None:
    messages = conversation(4)
    assert isinstance(planned(messages), Untouched)
    # The upstream reports twice what we estimate: the same history now crosses.
    assert not isinstance(planned(messages, factor=2.0), Untouched)


# -- properties ------------------------------------------------------------------------


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    for t in range(draw(st.integers(0, 30))):
        kind = draw(st.sampled_from(["tool", "tool", "tool", "chat", "system"]))
        if kind == "tool":
            n = draw(st.integers(1, 2))
            ids = [f"toolu_{t}_{k}" for k in range(n)]
            messages.append(
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": i, "name": "Read", "input": {"p": i}}
                        for i in ids
                    ],
                }
            )
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": i,
                            "content": words(draw(st.integers(5, 900)), i),
                        }
                        for i in ids
                    ],
                }
            )
        elif kind == "chat":
            messages.append({"role": "assistant", "content": words(draw(st.integers(1, 200)), "a")})
            messages.append({"role": "user", "content": words(draw(st.integers(1, 200)), "u")})
        else:
            messages.append({"role": "system", "content": "reminder"})
    return messages


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.booleans(), st.booleans())
def test_every_rewrite_is_valid_fits_and_is_deterministic(
    messages: list[dict[str, Any]], summarise: bool, store_ok: bool
) -> None:
    limits = policy()
    out = planned(messages, store_ok=store_ok)
    if isinstance(out, FoldPlan):
        out = fold(out, "notes: " + out.key if summarise else None, summary="made")
    if isinstance(out, Untouched):
        tokens = history_tokens(messages)
        if out.reason == "summary_pending":
            # Over the trigger, its summary asked for ahead: the request goes on unfolded
            # while it is within the deferral margin (working.DEFER_SHARE of the window).
            assert out.prepare is not None
            assert tokens <= limits.trigger_tokens + math.floor(limits.window * DEFER_SHARE)
        else:
            assert tokens <= limits.trigger_tokens
        return
    if isinstance(out, Refuse):
        return
    assert _pairing_errors(out.messages) == []
    assert out.messages[-1] == messages[-1]
    assert out.tokens_after <= limits.window - 500 - TOOL_TOKENS
    assert all(
        b.get("text", "x").strip()
        for m in out.messages
        if isinstance(m["content"], list)
        for b in m["content"]
    )
    again = planned(messages, store_ok=store_ok)
    if isinstance(again, FoldPlan):
        again = fold(again, "notes: " + again.key if summarise else None, summary="made")
    assert isinstance(again, Rewrite)
    assert orjson.dumps(again.messages) == orjson.dumps(out.messages)


@pytest.mark.parametrize("keep_results", [0, 1, 3])
def test_offload_respects_keep_results(keep_results: int) -> None:
    limits = policy(keep_results=keep_results, trigger=12_000, target=8_000)
    out = planned(conversation(12), policy=limits)
    assert isinstance(out, Rewrite)
    assert len(out.blobs) == 12 - keep_results


@pytest.mark.parametrize(("bound", "kept"), [(0, 3), (1, 1), (1.5, 1), (2.5, 2), (3.5, 3)])
def test_the_keep_window_is_bounded_in_tokens(bound: float, kept: int) -> None:
    """keep_results_tokens: of the newest keep_results results, only as many as fit stay
    whole (the newest whatever its size)."""
    messages = conversation(12)
    one = COUNTER.count_result(messages[-1]["content"][0]["content"])
    limits = policy(keep_results=3, keep_results_tokens=int(bound * one), trigger=12_000,
                    target=8_000)  # fmt: skip
    out = planned(messages, policy=limits)
    assert isinstance(out, Rewrite)
    assert len(out.blobs) == 12 - kept
    whole = [m for m in out.messages[-2 * kept :] if m["role"] == "user"]
    assert all("offloaded this result" not in str(m["content"]) for m in whole)


def test_an_offload_step_rebuilds_only_the_messages_it_stubs() -> None:
    from proxy.core.segments import Stub, Stubbed, Verbatim
    from proxy.core.working import rebuilt, working

    messages = conversation(6)
    inp = plan_input(messages)
    before: list[Any] = [Verbatim(n) for n in range(len(messages))]
    before[2] = Stubbed(2, (Stub(0, "r_earlier", 200),))
    work = working(before, inp)
    after = list(before)
    after[4] = Stubbed(4, (Stub(0, "r_new", 200),))
    after[8] = Stubbed(8, (Stub(0, "r_second", 200),))
    assert rebuilt(work, after, [8, 4], inp) == working(after, inp)


def _mixed(kinds: list[int], sizes: list[int]) -> list[dict[str, Any]]:
    """A history of pairs (kind 0), parallel pairs (1), plain texts (2) and calls left
    unanswered (3): every kind of group `group_history` makes."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Start."}]
    for t, (kind, size) in enumerate(zip(kinds, sizes, strict=False)):
        if kind == 2:
            messages.append({"role": "assistant", "content": words(size, f"a{t}_")})
            messages.append({"role": "user", "content": f"Go on {t}."})
            continue
        ids = [f"toolu_{t:04d}_{k}" for k in range(2 if kind == 1 else 1)]
        calls = [{"type": "tool_use", "id": i, "name": "Bash", "input": {}} for i in ids]
        messages.append({"role": "assistant", "content": calls})
        if kind == 3:
            messages.append({"role": "user", "content": f"Never mind {t}."})
            continue
        results = [
            {"type": "tool_result", "tool_use_id": i, "content": words(size, f"w{t}{i}_")}
            for i in ids
        ]
        messages.append({"role": "user", "content": results})
    return messages


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=14),
    st.lists(st.integers(20, 500), min_size=14, max_size=14),
)
def test_an_offload_step_groups_its_history_as_a_fresh_build_would(
    kinds: list[int], sizes: list[int]
) -> None:
    # The step keeps the groups of the history it stubs, recounted (working.rebuilt):
    # they must be those grouping its messages afresh makes.
    from proxy.core.history import group_history
    from proxy.core.rewrites import offload
    from proxy.core.working import segments_for, working

    messages = _mixed(kinds, sizes)
    inp = plan_input(messages)
    before = working(segments_for(None, inp.digests)[0], inp)
    after, blobs = offload(before, inp)
    assert after.groups == group_history(after.shapes)
    assert after.tokens == sum(shape.tokens for shape in after.shapes)
    if blobs:
        assert after.groups != before.groups  # recounted: a stub is shorter
