"""A fold sees what it replaces (issue 35): the in-place ask shows the originals of the
results offloaded in the folded span whole, each after its ref, up to ORIGINALS_TOKENS,
and the facts a summary must keep include those only the originals hold."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from proxy.core.offload import ref_for
from proxy.core.outcome import FoldPlan, Rewrite
from proxy.core.summariser_input import (
    IN_PLACE_OVERHEAD,
    ORIGINALS_TOKENS,
    SUMMARY_FLOOR,
    SUMMARY_SHARE,
    identifier_lines,
)
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


def test_the_summary_cap_is_sized_by_what_it_must_carry() -> None:
    # A fold of a few small turns: a twentieth of what it folds as the client sent it,
    # at least SUMMARY_FLOOR, not the policy's cap.
    small = policy(window=200_000, trigger=8_000, target=4_000, summary_max_tokens=4_000)
    messages = conversation(40, result_words=60)
    crossing = planned(messages, policy=small)
    # (Its summary is made ahead while the window has room: the fold it will take.)
    out = crossing if isinstance(crossing, FoldPlan) else getattr(crossing, "prepare", None)
    assert isinstance(out, FoldPlan)
    members = [m for g in out.work.groups if g.label in out.fold for m in g.members]
    sent = sum(COUNTER.count_message(messages[m]) for m in members)
    cap = out.summary_tokens + out.facts_budget
    assert cap == max(SUMMARY_FLOOR, math.ceil(SUMMARY_SHARE * sent)) < small.summary_max_tokens
    # The policy's cap bounds it.
    capped = planned(messages, policy=replace(small, summary_max_tokens=cap - 100))
    bounded = capped if isinstance(capped, FoldPlan) else getattr(capped, "prepare", None)
    assert isinstance(bounded, FoldPlan)
    assert bounded.summary_tokens + bounded.facts_budget == cap - 100


def test_past_the_whole_budget_the_longest_show_their_lines_that_name_something() -> None:
    messages = conversation(200, 400)
    prose = "the build went on and nothing else was said here at all"
    for n, message in enumerate(messages[2::2]):
        block = message["content"][0]
        lines = [f"{prose} {k}" for k in range(60)]
        lines.insert(30, f"The exporter of step {n} listens on port {9000 + n} here.")
        block["content"] = "\n".join(lines)
    ask = fold_of(messages).in_place.prompt
    shown = ask.count("listens on port")  # every original shown keeps its fact's line,
    assert shown > 100 and shown == ask.count("\n[r_") + ask.startswith("[r_")
    assert "port 9000 here" in ask and ref_for(messages[2]["content"][0]["content"]) in ask
    # ...and the longest lost their lines that name nothing, until the rest fit whole.
    assert 0 < ask.count(prose) < 60 * shown / 4
    assert "characters cut" not in ask


def test_identifier_lines_reduce_the_longest_first_until_the_rest_fits() -> None:
    long = "[r_0123456789abcdef]\nplain words only\nserver listens on port 8080\nmore words"
    short = "[r_1123456789abcdef]\nplain words only"
    pieces, tokens = [short, long], [10, 40]
    identifier_lines(pieces, tokens, whole=45)
    assert pieces == [short, "[r_0123456789abcdef]\nserver listens on port 8080"]
    assert tokens[0] == 10 and tokens[1] < 40
    unchanged = [short, long]
    identifier_lines(unchanged, [10, 40], whole=50)
    assert unchanged == [short, long]
