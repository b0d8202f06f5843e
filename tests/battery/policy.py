"""The battery's compaction policy: small enough that a few kilobytes of history are
offloaded, folded and packed (window 20k, offload from 1.5k, fold at 6k down to 4k)."""

from __future__ import annotations

from typing import Any

BATTERY_WINDOW = 20_000
BATTERY_POLICY: dict[str, Any] = {
    "match": "*",
    "window": BATTERY_WINDOW,
    "trigger": 6_000,
    "target": 4_000,
    "offload_trigger": 1_500,
    "keep_last": 2,
    "keep_results": 1,
    "offload_threshold": 200,
    # Each result offloaded as it ages in every format (Chat, Responses and Gemini batch
    # by default): the battery checks what a rewrite looks like, with a few of them.
    "offload_batch": 1,
    "stub_head_chars": 200,
    "summary_max_tokens": 600,
}
