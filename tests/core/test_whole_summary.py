"""The planner's choice for a summary of a whole history (a compaction the proxy serves):
in place when the summariser is the conversation's model and it fits, else a transcript."""

from __future__ import annotations

from proxy.core.digests import chain_hash, message_digest
from proxy.core.policy import Policy
from proxy.core.summariser_input import (
    IN_PLACE_OVERHEAD,
    summariser_room,
    whole_key,
    whole_summary,
)

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


def test_a_transcript_takes_the_room_less_the_slot_and_the_instruction() -> None:
    whole = whole_summary(POLICY, 1.0, "gpt-x", lambda: 200_000)
    assert whole.in_place == 0 and whole.summary_tokens == POLICY.summary_max_tokens
    assert whole.transcript_budget(150) == summariser_room(POLICY, 1.0) - 4_000 - 150


def test_a_whole_summary_is_kept_under_the_hash_of_every_message_it_saw() -> None:
    history = [{"role": "user", "content": "fix the build"}, {"role": "assistant", "content": "ok"}]
    assert whole_key(history) == chain_hash([message_digest(m) for m in history])
    assert whole_key(history[:1]) != whole_key(history)
