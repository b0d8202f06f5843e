"""Server-sent events, sans I/O: bytes in, events out, and back.

The decoder takes chunks cut anywhere (inside a line, inside a CRLF) and yields each
event once its blank line arrives. Lines of any length are fine: the buffer grows until
a line ends. Only `event:` and `data:` fields matter to us; others (`id:`, `retry:`,
comments) are kept in the event's raw bytes, which is what gets relayed when an event
passes through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Event:
    name: str  # the `event:` field; "message" when absent (SSE spec); "" for comments
    data: str  # the `data:` lines joined by "\n"
    raw: bytes  # the event as it came, blank line included


class SSEDecoder:
    def __init__(self) -> None:
        self._buffer = b""
        self._lines: list[bytes] = []
        self._raw: list[bytes] = []

    def feed(self, chunk: bytes) -> list[Event]:
        self._buffer += chunk
        events: list[Event] = []
        while True:
            end, skip = _line_end(self._buffer)
            if end < 0:
                break
            line, self._buffer = self._buffer[:end], self._buffer[end + skip :]
            self._raw.append(line + b"\n")
            if line:
                self._lines.append(line)
            elif self._lines:
                events.append(self._event())
            else:
                self._raw.clear()  # blank lines between events
        return events

    def close(self) -> list[Event]:
        """Events left when the stream ends: an unterminated last event is dropped, as
        the SSE spec says (a stream cut mid-event never dispatches it)."""
        self._buffer = b""
        self._lines.clear()
        self._raw.clear()
        return []

    @property
    def pending(self) -> bool:
        """Whether part of an event has arrived without its end."""
        return bool(self._buffer or self._lines)

    def _event(self) -> Event:
        name = "message"
        data: list[str] = []
        if all(line.startswith(b":") for line in self._lines):
            name = ""  # only comments: nothing to dispatch, but the bytes can be relayed
        for line in self._lines:
            field, _, value = line.partition(b":")
            if value.startswith(b" "):
                value = value[1:]
            if field == b"event":
                name = value.decode("utf-8", "replace")
            elif field == b"data":
                data.append(value.decode("utf-8", "replace"))
        raw = b"".join(self._raw)
        self._lines.clear()
        self._raw.clear()
        return Event(name, "\n".join(data), raw)


def _line_end(buffer: bytes) -> tuple[int, int]:
    """Index of the first line end and its length; (-1, 0) when none is complete.

    A CR at the very end of the buffer may be the first half of a CRLF, so it waits.
    """
    lf = buffer.find(b"\n")
    cr = buffer.find(b"\r", 0, lf if lf >= 0 else len(buffer))
    if cr < 0:
        return (lf, 1) if lf >= 0 else (-1, 0)
    if cr + 1 == len(buffer):
        return -1, 0
    return (cr, 2) if buffer[cr + 1 : cr + 2] == b"\n" else (cr, 1)


def encode_event(name: str, data: bytes) -> bytes:
    """One event in the API's framing: `event: NAME`, one `data:` line, a blank line."""
    return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"
