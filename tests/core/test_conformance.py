"""The shared conformance vectors: the planning core must match them exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.core.fold import plan_compaction
from proxy.core.pack import pack_context

FIXTURES = Path(__file__).parents[1] / "fixtures"
PACK = json.loads((FIXTURES / "pack_context.json").read_text())
PLAN = json.loads((FIXTURES / "plan_compaction.json").read_text())


@pytest.mark.parametrize("case", PACK, ids=[c["name"] for c in PACK])
def test_pack_context_vectors(case: dict) -> None:
    got = pack_context(case["messages"], case["budget"], case["note_cost"])
    assert got == case["expected"]


@pytest.mark.parametrize("case", PLAN, ids=[c["name"] for c in PLAN])
def test_plan_compaction_vectors(case: dict) -> None:
    turns = [(label, tokens) for label, tokens in case["turns"]]
    got = plan_compaction(turns, case["budget"], case["keep_last"])
    expected = case["expected"]
    assert got == (None if expected is None else tuple(expected))


def test_vectors_are_all_there() -> None:
    assert len(PACK) >= 13 and len(PLAN) >= 13
