"""The Responses API over WebSocket, sans I/O: what one socket's frames mean.

A client frame is `{"type": "response.create", ...the HTTP body's fields}`; with
`previous_response_id` its `input` holds only the items after that response's input and
output (the server keeps only the most recent response of a connection). The proxy keeps,
per socket and per side, the most recent response as a `Kept` (its id and the whole input
plus output it ended with), so:

- `resolve` turns a client frame into the whole request, as an HTTP body would be, so the
  driver sees the whole history (None when the id is not the one this socket kept);
- `upstream_frame` sends upstream only the new items while the rewritten request extends
  the upstream's kept response item for item, and the whole rewritten input otherwise (a
  crossing changed the prefix, or a read_result round's items are gone from it).

Server frames are the SSE events' JSON; a response ends at `response.completed`,
`response.incomplete` or `response.failed`, or at an error frame with a `status`
(`{"type": "error", "status": N, "error": {...}, "headers": {...}}`, read like an HTTP
status N). The read_result merger works on SSE events: `as_event` and `frame_of` carry a
frame across.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.sse import Event, encode_event
from proxy.wire.responses_units import input_items

CREATE = "response.create"
ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})
_FRAME_ONLY = ("type", "previous_response_id")
# Of an HTTP refusal's headers, what an error frame carries (Codex reads retry hints).
ERROR_HEADERS = ("retry-after", "retry-after-ms", "x-request-id", "x-should-retry")


@dataclass(frozen=True, slots=True)
class Kept:
    """A socket's most recent response: its id, and the items a request that names it
    extends (its whole input, then its output)."""

    id: str
    items: tuple[Any, ...]


def parsed_frame(text: str) -> dict[str, Any] | None:
    """A text frame's JSON object (None: not JSON, or not an object)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def resolve(kept: Kept | None, frame: Mapping[str, Any]) -> dict[str, Any] | None:
    """The whole request a `response.create` frame stands for (its fields without the
    frame's own), or None when it names a response this socket does not keep."""
    body = {k: v for k, v in frame.items() if k not in _FRAME_ONLY}
    previous = frame.get("previous_response_id")
    if previous is None:
        return body
    if kept is None or previous != kept.id:
        return None
    body["input"] = [*kept.items, *input_items(frame)]
    return body


def upstream_frame(kept: Kept | None, sent: Mapping[str, Any]) -> tuple[dict[str, Any], int]:
    """The frame for a request as the proxy sends it, and how many items it leaves to
    the kept response (0: the whole input goes)."""
    items = input_items(sent)
    frame: dict[str, Any] = {"type": CREATE, **sent}
    if kept is not None and kept.items and _extends(items, kept.items):
        frame["previous_response_id"] = kept.id
        frame["input"] = items[len(kept.items) :]
        return frame, len(kept.items)
    return frame, 0


def _extends(items: Sequence[Any], prefix: Sequence[Any]) -> bool:
    if len(items) < len(prefix):
        return False
    return all(a == b for a, b in zip(items, prefix, strict=False))


def kept_after(request_input: Sequence[Any], end: Mapping[str, Any]) -> Kept | None:
    """What a socket keeps once a response ended with the event `end` (None: nothing,
    as after a failed response or an error)."""
    if end.get("type") not in ("response.completed", "response.incomplete"):
        return None
    response = end.get("response")
    if not isinstance(response, dict) or not isinstance(response.get("id"), str):
        return None
    output = response.get("output")
    output = output if isinstance(output, list) else []
    return Kept(response["id"], (*request_input, *output))


def ends_response(event: Mapping[str, Any]) -> bool:
    kind = event.get("type")
    return kind in ENDS or (kind == "error" and "status" in event)


def is_error_frame(event: Mapping[str, Any]) -> bool:
    return event.get("type") == "error" and isinstance(event.get("status"), int)


def error_frame(
    status: int, error: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> str:
    frame: dict[str, Any] = {"type": "error", "status": status, "error": dict(error)}
    if headers:
        frame["headers"] = dict(headers)
    return orjson.dumps(frame).decode()


def error_frame_of(status: int, body: bytes, headers: Mapping[str, str]) -> str:
    """An HTTP error answer (OpenAI's `{"error": {...}}`) as the error frame."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict):
        error = {"message": body.decode(errors="replace")[:2000], "type": "api_error"}
    kept = {n: headers[n] for n in ERROR_HEADERS if n in headers}
    return error_frame(status, error, kept)


def as_event(text: str, kind: str) -> Event:
    """A frame as the SSE event it would have been on HTTP."""
    data = text.encode()
    return Event(kind, text, encode_event(kind, data))


def frame_of(event: bytes) -> str:
    """The frame for one encoded SSE event (`event: X\\ndata: JSON\\n\\n`)."""
    start = event.find(b"data: ")
    if start < 0:
        return ""
    return event[start + 6 :].rstrip(b"\r\n").decode()


def frames_of_sse(body: bytes) -> list[str]:
    """The frames of a whole SSE body, one per event with data."""
    out = []
    for block in body.split(b"\n\n"):
        frame = frame_of(block)
        if frame:
            out.append(frame)
    return out
