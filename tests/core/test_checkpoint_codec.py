"""A checkpoint as the store keeps it: the codec round-trips it, and what an earlier
version wrote (no renewal time) still decodes."""

from __future__ import annotations

import dataclasses

import orjson

from proxy.core.checkpoint import decode_checkpoint, encode_checkpoint
from proxy.core.driver import commands_of, compaction
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


def test_a_checkpoint_without_a_renewal_time_decodes_as_never_renewed() -> None:
    raw = stored()
    for renewed in (None, "1000", True):
        older = {k: v for k, v in raw.items() if k != "renewed"}
        if renewed is not None:
            older["renewed"] = renewed
        checkpoint = decode_checkpoint(older)
        assert checkpoint is not None and checkpoint.renewed_at == 0
        assert dataclasses.replace(checkpoint, renewed_at=1_000) == decode_checkpoint(raw)
