"""Checks the Messages and the Chat end-to-end compaction tests make alike."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.core.digests import message_digest

STUB = b"compaction-proxy offloaded this result"
FOLDS = ("summary", "pack")


def text_of(content: Any) -> str:
    """A tool result's text: its string, or its text parts (a Messages stub also holds a
    tool_reference that loads the deferred read_result tool)."""
    if isinstance(content, str):
        return content
    return "\n".join(p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text")


def folds(strategies: list[str | None]) -> list[str]:
    """The crossings that folded or dropped turns (not the offload steps between them)."""
    return [s for s in strategies if s and any(kind in s for kind in FOLDS)]


def assert_stubs_frozen_between_folds(
    requests: list[dict[str, Any]], strategies: list[str | None]
) -> None:
    """Between folds the stubbed region only grows: a message sent as a stub is sent the
    same, at the same place, on every later request until the next fold."""
    grew = 0
    for n in range(1, len(requests)):
        if strategies[n] and any(kind in str(strategies[n]) for kind in FOLDS):
            continue
        before, after = requests[n - 1]["messages"], requests[n]["messages"]
        for j, message in enumerate(before):
            if STUB in orjson.dumps(message):
                assert message_digest(after[j]) == message_digest(message), (
                    f"turn {n}: the stub at {j} changed or moved between folds"
                )
        stubs = [j for j, m in enumerate(after) if STUB in orjson.dumps(m)]
        grew += len(stubs) > len([m for m in before if STUB in orjson.dumps(m)])
    assert grew, "the stubbed region never grew: nothing was tested"


def assert_prefix_stable_between_crossings(
    requests: list[dict[str, Any]], strategies: list[str | None]
) -> None:
    """On every turn that crossed no threshold ("checkpoint"), the upstream request starts
    with the previous one's messages, digest for digest, and the same tools: what keeps
    the upstream's prompt cache reading."""
    for n in range(1, len(requests)):
        if strategies[n] != "checkpoint":
            continue
        before, after = requests[n - 1]["messages"], requests[n]["messages"]
        assert [message_digest(m) for m in before] == [
            message_digest(m) for m in after[: len(before)]
        ], f"turn {n}: the prefix moved between crossings"
        assert requests[n]["tools"] == requests[n - 1]["tools"]
