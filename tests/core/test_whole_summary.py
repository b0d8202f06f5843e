"""The planner's choice for a summary of a whole history (a compaction the proxy serves):
in place when the summariser is the conversation's model and it fits, else a transcript."""

from __future__ import annotations

from proxy.core.policy import Policy
from proxy.core.summariser_input import IN_PLACE_OVERHEAD, summariser_room, whole_summary

POLICY = Policy(window=100_000, summary_max_tokens=4_000)


def test_in_place_when_it_fits_with_its_prompt_and_slot() -> None:
    room = summariser_room(POLICY, 1.0)
    assert room == 95_000  # 5% of the window kept free
    fits = room - POLICY.summary_max_tokens - IN_PLACE_OVERHEAD
    whole = whole_summary(POLICY, 1.0, "gpt-x", lambda: fits)
    assert whole.model == "gpt-x" and whole.in_place == fits + IN_PLACE_OVERHEAD
    over = whole_summary(POLICY, 1.0, "gpt-x", lambda: fits + 1)
    assert over.model == "gpt-x" and over.in_place == 0 and over.room == room


def test_a_factor_shrinks_the_room_and_one_below_1_never_grows_it() -> None:
    assert summariser_room(POLICY, 2.0) == 47_500
    assert summariser_room(POLICY, 0.5) == summariser_room(POLICY, 1.0)
    assert whole_summary(POLICY, 2.0, "gpt-x", lambda: 45_000).in_place == 0
    assert whole_summary(POLICY, 1.0, "gpt-x", lambda: 45_000).in_place == 45_600


def test_another_summariser_gets_a_transcript_without_counting_the_history() -> None:
    policy = Policy(window=100_000, summariser_model="gpt-small")

    def never() -> int:
        raise AssertionError("counted for a transcript")

    whole = whole_summary(policy, 1.0, "gpt-x", never)
    assert whole.model == "gpt-small" and whole.in_place == 0
    same = whole_summary(Policy(window=100_000, summariser_model="gpt-x"), 1.0, "gpt-x", lambda: 1)
    assert same.model == "gpt-x" and same.in_place == 1 + IN_PLACE_OVERHEAD
