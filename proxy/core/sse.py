"""Server-sent events, sans I/O: bytes in, events out, and back.

The decoder takes chunks cut anywhere (inside a line, inside a CRLF) and yields each
event once its blank line arrives. Work is linear in the bytes fed: the buffer is
scanned once from where the last scan stopped and trimmed once per `feed`, so a 1 MiB
chunk of small events or one long line arriving in small pieces costs the same per byte.
Only `event:` and `data:` fields matter to us; others (`id:`, `retry:`, comments) are
kept in the event's raw bytes, which is what gets relayed when an event passes through
unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINE_END = re.compile(rb"[\r\n]")


@dataclass(frozen=True, slots=True)
class Event:
    name: str  # the `event:` field; "message" when absent (SSE spec); "" for comments
    data: str  # the `data:` lines joined by "\n"
    raw: bytes  # the event as it came, blank line included


class SSEDecoder:
    def __init__(self) -> None:
        self._buffer = bytearray()
        self._scan = 0  # where the search for the next line end resumes
        self._line = 0  # start of the line being read
        self._event = 0  # start of the event being read (its raw bytes)
        self._fields: list[bytes] = []  # the event's non-empty lines so far

    def feed(self, chunk: bytes) -> list[Event]:
        buffer = self._buffer
        buffer += chunk
        events: list[Event] = []
        size = len(buffer)
        # The APIs end lines with LF alone: with no CR in the new bytes (and none waiting
        # for its LF), a plain find will do.
        lf_only = self._scan == size - len(chunk) and b"\r" not in chunk
        while True:
            if lf_only:
                end = buffer.find(b"\n", self._scan)
                if end < 0:
                    self._scan = size
                    break
                after = end + 1
            else:
                found = _LINE_END.search(buffer, self._scan)
                if found is None:
                    self._scan = size
                    break
                end = found.start()
                after = end + 1
            if buffer[end] == 0x0D:  # CR: a CRLF counts once, so wait for the next byte
                if end + 1 == size:
                    self._scan = end
                    break
                after = end + 2 if buffer[end + 1] == 0x0A else end + 1
            if end > self._line:
                self._fields.append(bytes(buffer[self._line : end]))
            elif self._fields:  # a blank line ends the event
                events.append(self._dispatch(bytes(buffer[self._event : after])))
                self._event = after
            else:
                self._event = after  # blank lines between events belong to none
            self._line = self._scan = after
        if self._event:
            # Keep only the event being read; every index moves down with it.
            del buffer[: self._event]
            self._scan -= self._event
            self._line -= self._event
            self._event = 0
        return events

    def close(self) -> list[Event]:
        """Events left when the stream ends: an unterminated last event is dropped, as
        the SSE spec says (a stream cut mid-event never dispatches it)."""
        self._buffer.clear()
        self._scan = self._line = self._event = 0
        self._fields.clear()
        return []

    @property
    def buffered(self) -> int:
        """Bytes held of the event being read (what a cap on one event bounds)."""
        return len(self._buffer)

    @property
    def pending(self) -> bool:
        """Whether part of an event has arrived without its end."""
        return bool(self._buffer or self._fields)

    def _dispatch(self, raw: bytes) -> Event:
        lines = self._fields
        self._fields = []
        name = ""  # only comments: nothing to dispatch, but the bytes can be relayed
        data: list[bytes] = []
        for line in lines:
            if line[:1] == b":":
                continue
            name = name or "message"
            field, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if field == b"data":
                data.append(value)
            elif field == b"event":
                name = value.decode("utf-8", "replace")
        return Event(name, b"\n".join(data).decode("utf-8", "replace"), raw)


def encode_event(name: str, data: bytes) -> bytes:
    """One event in the API's framing: `event: NAME`, one `data:` line, a blank line."""
    return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"
