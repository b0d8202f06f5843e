"""Parse an SSE body into (event, data) pairs, the way SSE clients do."""

from __future__ import annotations

import re


def parse_events(body: bytes) -> list[tuple[str, str]]:
    events = []
    text = body.decode()
    # The piece after the last blank line is an unfinished event: clients drop it.
    for block in re.split(r"\r\n\r\n|\n\n|\r\r", text)[:-1]:
        name, data = "message", []
        for line in re.split(r"\r\n|\n|\r", block):
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
        if data:
            events.append((name, "\n".join(data)))
    return events
