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
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.testing.script import Script

CREATED_AT = 1_764_000_000  # fixed: the same request gets the same bytes
PIECE_CHARS = 24  # characters of arguments / custom input per delta


@dataclass(frozen=True)
class Answer:
    items: list[dict[str, Any]]  # the output items, completed
    output_tokens: int
    reasoning_tokens: int = 0
    incomplete: str | None = None  # "max_output_tokens" when cut short


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


def usage_object(input_tokens: int, cached: int, answer: Answer) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": answer.output_tokens,
        "output_tokens_details": {"reasoning_tokens": answer.reasoning_tokens},
        "total_tokens": input_tokens + answer.output_tokens,
    }


def final_status(answer: Answer) -> str:
    return "incomplete" if answer.incomplete else "completed"


class _Sequence:
    def __init__(self) -> None:
        self.n = 0

    def event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.n, **fields}
        self.n += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _pieces(text: str, words: int) -> Iterator[str]:
    parts = text.split(" ")
    for i in range(0, len(parts), words):
        piece = " ".join(parts[i : i + words])
        yield piece if i + words >= len(parts) else piece + " "


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


def _item_events(
    seq: _Sequence, index: int, item: dict[str, Any], script: Script
) -> Iterator[tuple[str, bytes]]:
    kind, item_id = item["type"], item["id"]
    at = {"output_index": index, "item_id": item_id}
    yield "block", seq.event("response.output_item.added", output_index=index, item=_started(item))
    if kind == "compaction":
        yield "block", seq.event("response.compaction.compacting", **at)
    elif kind == "message":
        for c, part in enumerate(item["content"]):
            text = part["text"]
            empty = {**part, "text": ""}
            yield (
                "block",
                seq.event("response.content_part.added", **at, content_index=c, part=empty),
            )
            for piece in _pieces(text, script.chunk_tokens):
                yield (
                    "delta",
                    seq.event(
                        "response.output_text.delta",
                        **at,
                        content_index=c,
                        delta=piece,
                        logprobs=[],
                    ),
                )
            yield (
                "block",
                seq.event(
                    "response.output_text.done", **at, content_index=c, text=text, logprobs=[]
                ),
            )
            yield "block", seq.event("response.content_part.done", **at, content_index=c, part=part)
    elif kind in ("function_call", "custom_tool_call"):
        field, name = (
            ("arguments", "function_call_arguments")
            if kind == "function_call"
            else ("input", "custom_tool_call_input")
        )
        payload = item[field]
        for i in range(0, len(payload), PIECE_CHARS):
            delta = payload[i : i + PIECE_CHARS]
            yield "delta", seq.event(f"response.{name}.delta", **at, delta=delta)
        yield "block", seq.event(f"response.{name}.done", **at, **{field: payload})
    yield "block", seq.event("response.output_item.done", output_index=index, item=item)


def stream_events(
    head: dict[str, Any],
    body: dict[str, Any],
    answer: Answer,
    usage: dict[str, Any],
    script: Script,
) -> list[tuple[str, bytes]]:
    """(kind, bytes) of the stream; kind marks where faults and delays apply."""
    seq = _Sequence()
    started = response_object(head, body, [], "in_progress", None)
    events = [
        ("start", seq.event("response.created", response=started)),
        ("block", seq.event("response.in_progress", response=started)),
    ]
    for index, item in enumerate(answer.items):
        events.extend(_item_events(seq, index, item, script))
    status = final_status(answer)
    done = response_object(head, body, answer.items, status, usage, answer.incomplete)
    events.append(("end", seq.event(f"response.{status}", response=done)))
    return events


def error_event(sequence_number: int, error: dict[str, Any]) -> bytes:
    """The `error` event: flat as OpenAI's schema has it (code, message, param), with the
    nested `error` object streams have been seen carrying too (Codex reads either)."""
    flat = {k: error.get(k) for k in ("code", "message", "param")}
    data = {"type": "error", "sequence_number": sequence_number, **flat, "error": error}
    return b"event: error\ndata: " + orjson.dumps(data) + b"\n\n"


def failed_events(
    head: dict[str, Any], body: dict[str, Any], error: dict[str, Any]
) -> list[tuple[str, bytes]]:
    """A stream that fails before any output: created, in_progress, `error`, then
    `response.failed` (how the API reports a window exceeded on a stream)."""
    seq = _Sequence()
    started = response_object(head, body, [], "in_progress", None)
    failed = response_object(head, body, [], "failed", None)
    failed["error"] = {"code": error.get("code"), "message": error.get("message")}
    events = [
        ("start", seq.event("response.created", response=started)),
        ("block", seq.event("response.in_progress", response=started)),
    ]
    events.append(("block", error_event(seq.n, error)))
    seq.n += 1
    events.append(("end", seq.event("response.failed", response=failed)))
    return events


def stream_error_position(events: list[tuple[str, bytes]]) -> int:
    """The sequence number a mid-stream `error` fault gets: send_stream writes the events up
    to the first delta (or up to the first end event, when there is no delta)."""
    for n, (kind, _) in enumerate(events):
        if kind == "delta":
            return n + 1
        if kind == "end":
            return n
    return len(events)
