"""Properties of plan_compaction over generated histories."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.fold import plan_compaction


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[str, int]]:
    turns = [(f"t{i}", draw(st.integers(1, 30_000))) for i in range(draw(st.integers(0, 40)))]
    if draw(st.booleans()):
        turns.insert(0, ("summary", draw(st.integers(1, 10_000))))
    return turns


ARGS = (histories(), st.integers(0, 200_000), st.integers(0, 15))


@settings(max_examples=3000)
@given(*ARGS)
def test_fold_and_keep_are_every_label_in_order(turns, budget: int, keep_last: int) -> None:
    plan = plan_compaction(turns, budget, keep_last)
    if plan is not None:
        fold, keep, _ = plan
        assert fold + keep == [label for label, _ in turns]


@settings(max_examples=3000)
@given(*ARGS)
def test_an_earlier_summary_is_never_kept_when_folding(turns, budget: int, keep_last: int) -> None:
    plan = plan_compaction(turns, budget, keep_last)
    if plan is not None and plan[0]:
        fold, keep, _ = plan
        assert "summary" not in keep
        if turns[0][0] == "summary":
            assert fold[0] == "summary"


@settings(max_examples=3000)
@given(*ARGS)
def test_slot_is_budget_minus_kept(turns, budget: int, keep_last: int) -> None:
    plan = plan_compaction(turns, budget, keep_last)
    sizes = dict(turns)
    if plan is None:
        # Refused only when it does not fit and there is nothing to fold or no room left.
        assert sum(sizes.values()) > budget
        return
    fold, keep, summary_tokens = plan
    if not fold:
        assert summary_tokens == 0 and sum(sizes.values()) <= budget
    else:
        assert summary_tokens == budget - sum(sizes[label] for label in keep)
        assert summary_tokens > 0
        # After compaction the history (summary at most `summary_tokens`) is within the budget.
        assert summary_tokens + sum(sizes[label] for label in keep) <= budget


@settings(max_examples=3000)
@given(*ARGS)
def test_keeps_the_newest_keep_last_turns(turns, budget: int, keep_last: int) -> None:
    plan = plan_compaction(turns, budget, keep_last)
    if plan is not None and plan[0]:
        ordinary = [label for label, _ in turns if label != "summary"]
        assert plan[1] == ordinary[len(ordinary) - min(keep_last, len(ordinary)) :]
