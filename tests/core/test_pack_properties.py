"""Properties of pack_context over generated conversations."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.pack import pack_context


@st.composite
def conversations(draw: st.DrawFn) -> list[list]:
    """Conversations with system/user/assistant messages, paired calls and results,
    parallel and repeated results, and the occasional malformed call or result."""
    messages: list[list] = []
    next_call = 0
    open_calls: list[str] = []
    for _ in range(draw(st.integers(0, 30))):
        kind = draw(st.sampled_from(["system", "user", "assistant", "call", "result", "orphan"]))
        tokens = draw(st.integers(1, 400))
        if kind == "call":
            ref = f"c{next_call}"
            next_call += 1
            open_calls.append(ref)
            messages.append(["call", tokens, ref])
        elif kind == "result":
            if open_calls and draw(st.booleans()):
                ref = draw(st.sampled_from(open_calls))
            else:
                ref = f"ghost{len(messages)}"
            messages.append(["result", tokens, ref])
        elif kind == "orphan":
            messages.append(["call", tokens, f"lonely{len(messages)}"])
        else:
            messages.append([kind, tokens, ""])
    return messages


def _pinned(messages: list[list]) -> set[int]:
    pinned = {i for i, m in enumerate(messages) if m[0] == "system"}
    users = [i for i, m in enumerate(messages) if m[0] == "user"]
    if users:
        pinned.add(users[-1])
    return pinned


def _pairs(messages: list[list]) -> dict[str, list[int]]:
    calls = {m[2]: i for i, m in enumerate(messages) if m[0] == "call"}
    pairs: dict[str, list[int]] = {}
    for i, m in enumerate(messages):
        if m[0] == "result" and m[2] in calls:
            pairs.setdefault(m[2], [calls[m[2]]]).append(i)
    return pairs


BUDGETS = st.integers(0, 6000)
NOTE = st.integers(0, 100)


@settings(max_examples=2000)
@given(conversations(), BUDGETS, NOTE)
def test_kept_messages_fit_the_budget(messages: list[list], budget: int, note: int) -> None:
    result = pack_context(messages, budget, note)
    if result is None:
        pinned_cost = sum(messages[i][1] for i in _pinned(messages))
        assert pinned_cost + note > budget
        return
    cost = sum(messages[i][1] for i in result["keep"]) + (note if result["note"] else 0)
    assert cost <= budget
    assert result["keep"] == sorted(set(result["keep"]))


@settings(max_examples=2000)
@given(conversations(), BUDGETS, NOTE)
def test_a_call_and_its_results_stay_together(messages: list[list], budget: int, note: int) -> None:
    result = pack_context(messages, budget, note)
    if result is None:
        return
    kept = set(result["keep"])
    paired = set()
    for members in _pairs(messages).values():
        assert set(members) <= kept or not set(members) & kept
        paired.update(members)
    for i, m in enumerate(messages):
        if m[0] in ("call", "result") and i not in paired:
            assert i not in kept, "a malformed call or result was kept"


@settings(max_examples=2000)
@given(conversations(), BUDGETS, NOTE)
def test_pinned_messages_are_always_kept(messages: list[list], budget: int, note: int) -> None:
    result = pack_context(messages, budget, note)
    if result is not None:
        assert _pinned(messages) <= set(result["keep"])


@settings(max_examples=2000)
@given(conversations(), BUDGETS, NOTE)
def test_kept_groups_are_the_newest_run(messages: list[list], budget: int, note: int) -> None:
    """No dropped group is newer than a kept one: the kept history has no holes."""
    result = pack_context(messages, budget, note)
    if result is None:
        return
    kept = set(result["keep"])
    pinned = _pinned(messages)
    groups = [members for members in _pairs(messages).values()]
    groups += [
        [i] for i, m in enumerate(messages) if m[0] in ("user", "assistant") and i not in pinned
    ]
    positions = {min(g): all(i in kept for i in g) for g in groups}
    kept_positions = [p for p, k in positions.items() if k]
    dropped_positions = [p for p, k in positions.items() if not k]
    if kept_positions and dropped_positions:
        assert max(dropped_positions) < min(kept_positions)
    assert result["note"] == bool(dropped_positions)


@settings(max_examples=500)
@given(conversations(), BUDGETS, NOTE)
def test_deterministic(messages: list[list], budget: int, note: int) -> None:
    assert pack_context(messages, budget, note) == pack_context(list(messages), budget, note)
