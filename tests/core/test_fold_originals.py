"""A fold sees what it replaces (issue 35): the in-place ask shows the originals of the
results offloaded in the folded span whole, each after its ref, up to ORIGINALS_TOKENS,
and the facts a summary must keep include those only the originals hold."""

from __future__ import annotations

from typing import Any

from proxy.core.offload import ref_for
from proxy.core.outcome import FoldPlan, Rewrite
from proxy.core.summariser_input import IN_PLACE_OVERHEAD, ORIGINALS_TOKENS
from tests.core.test_planner import COUNTER, conversation, planned, policy

# A window wide enough that the originals' budget, not the window, bounds them.
WIDE = policy(window=200_000, offload_trigger=4_000)
FACT = "The exporter listens on port 9187 here."


def with_fact(turns: int, result_words: int) -> tuple[list[dict[str, Any]], str]:
    """A conversation whose first tool result holds FACT in its middle, and that result."""
    messages = conversation(turns, result_words)
    block = messages[2]["content"][0]
    words = block["content"].split(" ")
    words.insert(result_words // 2, FACT)
    block["content"] = " ".join(words)
    return messages, block["content"]


def fold_of(messages: list[dict[str, Any]]) -> FoldPlan:
    """The fold a long conversation gets after its early results were offloaded."""
    first = planned(messages[:21], policy=WIDE)
    assert isinstance(first, Rewrite) and first.strategy == "offload"
    out = planned(messages, first.checkpoint, policy=WIDE)
    assert isinstance(out, FoldPlan)
    return out


def test_the_in_place_ask_shows_an_offloaded_original_whole_after_its_ref() -> None:
    messages, original = with_fact(120, result_words=120)
    out = fold_of(messages)
    ask = out.in_place.prompt
    assert original in ask and "characters cut" not in ask
    assert ask.index(ref_for(original)) < ask.index(original)
    assert "note each ref next to what it holds" in ask
    # The stub hid it from the history; the facts to keep are ranked from the original.
    assert "port 9187" in out.facts.ranked()


def test_originals_past_the_budget_are_cut_to_it() -> None:
    messages, original = with_fact(120, result_words=400)
    ask = fold_of(messages).in_place.prompt
    assert "characters cut" in ask and original not in ask
    # Cut by the messages' counts, rendered as text: within a few percent of the budget.
    assert COUNTER.count_text(ask) <= ORIGINALS_TOKENS * 1.05 + IN_PLACE_OVERHEAD
