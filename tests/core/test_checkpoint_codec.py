"""A checkpoint as the store keeps it: the codec round-trips it, and what an earlier
version wrote (no renewal time, its strategy a plain word) still decodes."""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from proxy.core.driver import commands_of, compaction
from proxy.core.offload import Stub
from proxy.core.segments import Note, Stubbed, Summary, Verbatim
from proxy.core.strategy import Strategy
from tests.core.test_driver import Store, timed
from tests.core.test_planner import conversation


def stored() -> dict[str, object]:
    store = Store()
    commands_of(compaction(timed(conversation(12), 1_000)), store)
    (checkpoint,) = store.checkpoints.values()
    assert checkpoint.renewed_at == 1_000 and checkpoint.segments
    return orjson.loads(orjson.dumps(encode_checkpoint(checkpoint)))


def test_a_checkpoint_round_trips_through_json() -> None:
    raw = stored()
    checkpoint = decode_checkpoint(raw)
    assert checkpoint is not None and encode_checkpoint(checkpoint) == raw


# Decoding a checkpoint its crossing encoded gives back an equal one: the store keeps the
# object a crossing saved for the line's next load instead of decoding its bytes again
# (Store.save_crossing's `decoded`).
INDEX = st.integers(0, 2**40)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
SEGMENT = st.one_of(
    st.builds(Verbatim, INDEX),
    st.builds(Stubbed, INDEX, st.lists(st.builds(Stub, INDEX, TEXT, INDEX)).map(tuple)),
    st.builds(Summary, TEXT, INDEX, st.lists(TEXT).map(tuple)),
    st.builds(Note, TEXT, INDEX),
)
CHECKPOINT = st.builds(
    Checkpoint,
    covers=st.integers(1, 2**40),
    prefix_hash=TEXT,
    segments=st.lists(SEGMENT, max_size=8).map(tuple),
    tool=st.none() | TEXT,
    strategy=st.sampled_from(Strategy),
    summary_key=st.none() | TEXT,
    tokens_after=INDEX,
    renewed_at=INDEX,
)


@given(CHECKPOINT)
def test_decoding_an_encoded_checkpoint_gives_back_an_equal_one(checkpoint: Checkpoint) -> None:
    assert (
        decode_checkpoint(orjson.loads(orjson.dumps(encode_checkpoint(checkpoint)))) == checkpoint
    )


def test_a_crossings_checkpoint_decodes_back_equal() -> None:
    store = Store()
    commands_of(compaction(timed(conversation(12), 1_000)), store)
    (checkpoint,) = store.checkpoints.values()
    assert any(isinstance(seg, Stubbed) for seg in checkpoint.segments)
    assert (
        decode_checkpoint(orjson.loads(orjson.dumps(encode_checkpoint(checkpoint)))) == checkpoint
    )


def test_a_checkpoint_without_a_renewal_time_decodes_as_never_renewed() -> None:
    raw = stored()
    for renewed in (None, "1000", True):
        older = {k: v for k, v in raw.items() if k != "renewed"}
        if renewed is not None:
            older["renewed"] = renewed
        checkpoint = decode_checkpoint(older)
        assert checkpoint is not None and checkpoint.renewed_at == 0
        assert dataclasses.replace(checkpoint, renewed_at=1_000) == decode_checkpoint(raw)


# A checkpoint as an earlier release wrote it (the strategy a plain string): the words
# are the Strategy members' values, so every one it could write still decodes.
WRITTEN_BEFORE = {
    "v": 2,
    "n": 2,
    "hash": "364636540dd3fa24bf16cc067ea7451d",
    "segments": [["m", 0], ["s", 1, [[0, "r_6b4215e305546399", 200]]]],
    "tool": "read_result",
    "summary_key": None,
    "after": 4_000,
}
EARLIER_WORDS = ["checkpoint", "offload", "pack", "offload+pack", "summary", "offload+summary"]


@pytest.mark.parametrize("word", EARLIER_WORDS)
def test_a_checkpoint_an_earlier_release_wrote_decodes_with_its_strategy(word: str) -> None:
    raw = {**WRITTEN_BEFORE, "strategy": word}
    checkpoint = decode_checkpoint(raw)
    assert checkpoint is not None and checkpoint.strategy is Strategy(word)
    again = encode_checkpoint(checkpoint)
    assert again["strategy"] == word and type(again["strategy"]) is str
    assert orjson.loads(orjson.dumps(again)) == {**raw, "renewed": 0}


def test_every_strategy_is_a_word_an_earlier_release_wrote() -> None:
    assert sorted(s.value for s in Strategy) == sorted(EARLIER_WORDS)


@pytest.mark.parametrize("word", ["fold", "", "Summary", 3, None, ["summary"]])
def test_a_checkpoint_with_a_strategy_no_release_wrote_is_malformed(word: object) -> None:
    assert decode_checkpoint({**WRITTEN_BEFORE, "strategy": word}) is None
