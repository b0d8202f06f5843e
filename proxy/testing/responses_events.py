"""The stand-in's Responses answers: the response object and its stream of events.

A stream is what the API sends: `response.created` and `response.in_progress` (the response
with no output yet), then per output item `response.output_item.added`, its own events, and
`response.output_item.done`, then `response.completed` (or `response.incomplete`) with the
whole response and its usage. Every event has `type` and a `sequence_number` counting from
0; item events carry `output_index` (and `item_id`). Per item kind:
- message: `content_part.added`, `output_text.delta`s, `output_text.done`, `content_part.done`;
- function_call: `function_call_arguments.delta`s then `.done`;
- custom_tool_call: `custom_tool_call_input.delta`s then `.done`;
- compaction: `response.compaction.compacting` (the item is whole from the start: Codex
  parses every added item, and a compaction item needs its encrypted_content);
- reasoning: nothing between (the sealed content only in done).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from proxy.testing.api import Event, json_pieces, text_pieces
from proxy.testing.reply import Usage

CREATED_AT = 1_764_000_000  # fixed: the same request gets the same bytes


def response_object(
    head: dict[str, Any],
    body: dict[str, Any],
    output: list[dict[str, Any]],
    status: str,
    usage: dict[str, Any] | None,
    incomplete: str | None = None,
) -> dict[str, Any]:
    reasoning = body.get("reasoning")
    reasoning = reasoning if isinstance(reasoning, dict) else {}
    text = body.get("text")
    text = text if isinstance(text, dict) else {}
    return {
        "id": head["id"],
        "object": "response",
        "created_at": CREATED_AT,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": None,
        "model": head["model"],
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "safety_identifier": None,
        "service_tier": "default",
        "store": body.get("store", True),
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": text.get("verbosity", "medium")},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_logprobs": 0,
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": body.get("metadata") or {},
    }


def usage_object(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt,
        "input_tokens_details": {"cached_tokens": usage.cache_read},
        "output_tokens": usage.output,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning},
        "total_tokens": usage.prompt + usage.output,
    }


class _Sequence:
    """Events numbered from 0, as the API numbers them."""

    def __init__(self) -> None:
        self.n = 0

    def event(self, where: str, kind: str, **fields: Any) -> Event:
        data = {"type": kind, "sequence_number": self.n, **fields}
        self.n += 1
        return Event(where, orjson.dumps(data), kind)


def _started(item: dict[str, Any]) -> dict[str, Any]:
    """The item as `output_item.added` shows it: in progress, its payload still empty."""
    kind = item["type"]
    if kind == "message":
        return {**item, "status": "in_progress", "content": []}
    if kind == "function_call":
        return {**item, "status": "in_progress", "arguments": ""}
    if kind == "custom_tool_call":
        return {**item, "status": "in_progress", "input": ""}
    if kind == "reasoning":
        return {k: v for k, v in item.items() if k != "encrypted_content"}
    return dict(item)


def _item_events(seq: _Sequence, index: int, item: dict[str, Any], words: int) -> Iterator[Event]:
    kind, item_id = item["type"], item["id"]
    at = {"output_index": index, "item_id": item_id}
    yield seq.event("block", "response.output_item.added", output_index=index, item=_started(item))
    if kind == "compaction":
        yield seq.event("block", "response.compaction.compacting", **at)
    elif kind == "message":
        for c, part in enumerate(item["content"]):
            text = part["text"]
            empty = {**part, "text": ""}
            yield seq.event(
                "block", "response.content_part.added", **at, content_index=c, part=empty
            )
            for piece in text_pieces(text, words):
                yield seq.event(
                    "delta", "response.output_text.delta", **at, content_index=c, delta=piece,
                    logprobs=[],
                )  # fmt: skip
            yield seq.event(
                "block", "response.output_text.done", **at, content_index=c, text=text, logprobs=[]
            )
            yield seq.event("block", "response.content_part.done", **at, content_index=c, part=part)
    elif kind in ("function_call", "custom_tool_call"):
        field, name = (
            ("arguments", "function_call_arguments")
            if kind == "function_call"
            else ("input", "custom_tool_call_input")
        )
        payload = item[field]
        for piece in json_pieces(payload):
            yield seq.event("delta", f"response.{name}.delta", **at, delta=piece)
        yield seq.event("block", f"response.{name}.done", **at, **{field: payload})
    yield seq.event("block", "response.output_item.done", output_index=index, item=item)


def _in_progress(response: dict[str, Any]) -> dict[str, Any]:
    """The response as it starts: no output, no usage yet."""
    return {**response, "status": "in_progress", "incomplete_details": None, "output": [],
            "usage": None}  # fmt: skip


def stream_events(response: dict[str, Any], words: int) -> list[Event]:
    """The whole response as the API streams it (`words` per text delta)."""
    seq = _Sequence()
    started = _in_progress(response)
    events = [
        seq.event("start", "response.created", response=started),
        seq.event("block", "response.in_progress", response=started),
    ]
    for index, item in enumerate(response["output"]):
        events.extend(_item_events(seq, index, item, words))
    events.append(seq.event("end", f"response.{response['status']}", response=response))
    return events


def error_event(sequence_number: int, error: dict[str, Any]) -> Event:
    """The `error` event: flat as OpenAI's schema has it (code, message, param), with the
    nested `error` object streams have been seen carrying too (Codex reads either)."""
    flat = {k: error.get(k) for k in ("code", "message", "param")}
    data = {"type": "error", "sequence_number": sequence_number, **flat, "error": error}
    return Event("end", orjson.dumps(data), "error")


def failed_events(response: dict[str, Any], error: dict[str, Any]) -> list[Event]:
    """A stream that fails before any output: created, in_progress, `error`, then
    `response.failed` (how the API reports a window exceeded on a stream)."""
    seq = _Sequence()
    started = _in_progress(response)
    failed = {**started, "status": "failed"}
    failed["error"] = {"code": error.get("code"), "message": error.get("message")}
    events = [
        seq.event("start", "response.created", response=started),
        seq.event("block", "response.in_progress", response=started),
        error_event(seq.n, error),
    ]
    seq.n += 1
    return [*events, seq.event("end", "response.failed", response=failed)]


def stream_error_position(events: list[Event]) -> int:
    """The sequence number a mid-stream `error` fault gets: the stream is sent up to the
    first delta (or up to the first end event, when there is no delta)."""
    for n, sent in enumerate(events):
        if sent.kind == "delta":
            return n + 1
        if sent.kind == "end":
            return n
    return len(events)
