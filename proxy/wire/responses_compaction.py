"""Codex's own compaction, served by the proxy: the pure parts.

Codex (as OpenAI's built-in provider) compacts by sending its history with a last item
`{"type": "compaction_trigger"}` and expects an answer with exactly one output item,
`{"type": "compaction", "encrypted_content": ...}`, which it then sends back in place of
the history it dropped. An upstream that is not OpenAI does not know either item. The
proxy can answer the trigger itself: the item it gives holds a sealed reference
(proxy/core/seal.py) to a summary it stored, and on every later request the proxy
replaces that item with the summary, as a user message, before anything else reads the
request. A reference that does not open (another tenant's, a summary gone from the
store) becomes a note saying the earlier history is not available: never forwarded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.core.seal import is_sealed
from proxy.core.sse import encode_event
from proxy.wire.responses_units import input_items, item_type

SUMMARY_HEADER = (
    "[compaction-proxy: summary of the conversation before it was compacted; the earlier"
    " messages are no longer available]"
)
MISSING_NOTE = (
    "[compaction-proxy: the conversation was compacted here, but its summary is no longer"
    " available; earlier messages cannot be recovered. Ask the user if something from them"
    " is needed.]"
)


def fitted(transcript: str, tokens: int, budget: int) -> str:
    """The transcript cut to about `budget` tokens: its start (the task) and its end (the
    latest work) kept, the middle cut with a line saying so."""
    if tokens <= budget or tokens <= 0:
        return transcript
    keep = max(400, len(transcript) * max(budget, 0) // tokens)
    half = keep // 2
    cut = len(transcript) - 2 * half
    return f"{transcript[:half]}\n[... {cut:,} characters cut ...]\n{transcript[-half:]}"


def is_trigger(body: Mapping[str, Any]) -> bool:
    """Codex's remote compaction request: the last input item is a compaction_trigger."""
    items = input_items(body)
    return bool(items) and item_type(items[-1]) == "compaction_trigger"


def sealed_items(body: Mapping[str, Any]) -> list[tuple[int, str]]:
    """(input index, encrypted_content) of each compaction item the proxy sealed."""
    return [
        (n, item["encrypted_content"])
        for n, item in enumerate(input_items(body))
        if item_type(item) == "compaction" and is_sealed(item.get("encrypted_content"))
    ]


def summary_item(text: str | None) -> dict[str, Any]:
    """What a sealed compaction item becomes: its summary, or the note that it is gone."""
    body = f"{SUMMARY_HEADER}\n{text.strip()}" if text and text.strip() else MISSING_NOTE
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": body}]}


def expanded(body: Mapping[str, Any], texts: Mapping[int, str | None]) -> dict[str, Any]:
    """The body with the sealed compaction items at these input indices replaced."""
    items = input_items(body)
    return {
        **body,
        "input": [summary_item(texts[n]) if n in texts else item for n, item in enumerate(items)],
    }


def compaction_item(sealed: str) -> dict[str, Any]:
    digest = hashlib.sha256(sealed.encode()).hexdigest()[:32]
    return {"id": f"cmp_{digest}", "type": "compaction", "encrypted_content": sealed}


def compaction_response(
    body: Mapping[str, Any],
    item: dict[str, Any],
    usage: dict[str, Any],
    created_at: int,
    *,
    status: str = "completed",
) -> dict[str, Any]:
    """The response object answering a compaction_trigger."""
    response_id = "resp_" + item["id"].removeprefix("cmp_")
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": body.get("model"),
        "output": [item] if status == "completed" else [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "prompt_cache_key": body.get("prompt_cache_key"),
        "store": body.get("store", True),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "usage": usage if status == "completed" else None,
        "metadata": body.get("metadata") or {},
    }


def compaction_usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def compaction_events(response: dict[str, Any]) -> bytes:
    """The answer as a stream, the events the API sends for a compaction: created,
    in_progress, the item added whole (Codex reads every added item), compacting, done,
    completed."""
    item = response["output"][0]
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    events: Sequence[tuple[str, dict[str, Any]]] = (
        ("response.created", {"response": started}),
        ("response.in_progress", {"response": started}),
        ("response.output_item.added", {"output_index": 0, "item": item}),
        ("response.compaction.compacting", {"output_index": 0, "item_id": item["id"]}),
        ("response.output_item.done", {"output_index": 0, "item": item}),
        ("response.completed", {"response": response}),
    )
    return b"".join(
        encode_event(kind, orjson.dumps({"type": kind, "sequence_number": n, **fields}))
        for n, (kind, fields) in enumerate(events)
    )
