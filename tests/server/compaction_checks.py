"""Checks the Messages and the Chat end-to-end compaction tests make alike."""

from __future__ import annotations

from typing import Any

from proxy.core.checkpoint import message_digest


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
