"""core/reuse.py: a request parsed as the continuation of its line is what a full parse
gives, whatever the line did (grew, moved its cache marker, rewound, forked); memory is
bounded."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.reuse import PARSED_FACTOR, Reuse


def _body(messages: list[Any], marker: bool = True) -> bytes:
    """A Claude Code-shaped body: messages first, the cache marker on the last one,
    system and tools after them."""
    shown = [dict(m) for m in messages]
    if marker and shown:
        last = dict(shown[-1])
        last["content"] = [{**last["content"][0], "cache_control": {"type": "ephemeral"}}]
        shown[-1] = last
    return orjson.dumps(
        {
            "model": "claude-opus-5-5",
            "messages": shown,
            "system": [{"type": "text", "text": "You are a coding agent."}],
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
            "max_tokens": 32000,
        }
    )


def _message(n: int, text: str = "") -> dict[str, Any]:
    role = "user" if n % 2 == 0 else "assistant"
    return {"role": role, "content": [{"type": "text", "text": text or f"turn {n} " * 40}]}


def test_a_growing_line_is_parsed_as_a_full_parse_would() -> None:
    reuse = Reuse(1 << 30)
    messages: list[Any] = []
    for n in range(30):
        messages.append(_message(n))
        raw = _body(messages)
        payload, seen = reuse.parse("k", raw, "messages")
        assert payload == orjson.loads(raw)
        assert seen is not None
        # From the second request on, all but the message that lost its marker are kept.
        assert seen.reused == max(0, n - 1)
    assert reuse.stats.hits == 29
    assert reuse.stats.misses == 1
    assert reuse.entries == 2  # the line, and its first request (which kept no message)


def test_kept_messages_are_the_same_objects_and_keep_what_was_computed() -> None:
    reuse = Reuse(1 << 30)
    first, _ = reuse.parse("k", _body([_message(0), _message(1)]), "messages")
    reuse.parse("k", _body([_message(0), _message(1), _message(2)]), "messages")
    _, seen = reuse.parse("k", _body([_message(n) for n in range(4)]), "messages")
    assert seen is not None
    assert seen.payload["messages"][0] is first["messages"][0]
    seen.known_of(seen.payload["messages"][0]).digest = b"d"
    _, later = reuse.parse("k", _body([_message(n) for n in range(5)]), "messages")
    assert later is not None
    assert later.known_of(later.payload["messages"][0]).digest == b"d"


def test_a_resend_is_parsed_as_it_was() -> None:
    """A retry sends the same bytes: every message is kept, nothing parsed again."""
    reuse = Reuse(1 << 30)
    raw = _body([_message(n) for n in range(6)])
    reuse.parse("k", raw, "messages")
    reuse.parse("k", raw, "messages")  # (the layout is found at the second request)
    payload, seen = reuse.parse("k", raw, "messages")
    assert seen is not None and seen.reused == 6
    assert payload == orjson.loads(raw)


def test_rewinds_forks_and_other_layouts() -> None:
    reuse = Reuse(1 << 30)
    line = [_message(n) for n in range(12)]
    bodies = [
        _body(line[:6]),
        _body(line[:8]),
        _body(line[:4]),  # a rewind
        _body([*line[:4], _message(4, "another way")]),  # a fork from there
        _body(line[:9]),  # the first line again
        _body(line[:9], marker=False),
        orjson.dumps({"model": "m", "messages": line[:10]}),  # other fields: a miss
        b'{"model": "m", "messages": []}',  # not orjson's writing
        b'{"model":"m","messages":[],"x":1}',
    ]
    for raw in bodies:
        payload, _ = reuse.parse("k", raw, "messages")
        assert payload == orjson.loads(raw)
    assert reuse.stats.hits >= 4


def test_a_region_that_is_not_a_list_of_messages_is_a_miss() -> None:
    reuse = Reuse(1 << 30)
    reuse.parse("k", b'{"messages":[{"a":1}],"tools":[]}', "messages")
    reuse.parse("k", b'{"messages":[{"a":1},{"b":2}],"tools":[]}', "messages")
    tricky = b'{"messages":[{"a":1}],"x":[{"b":2}],"tools":[]}'
    payload, _ = reuse.parse("k", tricky, "messages")
    assert payload == orjson.loads(tricky)


def test_memory_is_bounded_least_recently_used_first() -> None:
    one = len(_body([_message(0)]))
    reuse = Reuse(int(3.5 * one * PARSED_FACTOR))
    for n in range(6):
        reuse.parse(
            f"conversation {n}", _body([_message(0, f"conversation {n} " * 10)]), "messages"
        )
    assert reuse.bytes <= reuse.max_bytes
    assert reuse.entries in (3, 4)
    assert reuse.stats.evictions == 6 - reuse.entries
    assert Reuse(0).parse("k", b"[1]", "messages") == ([1], None)  # off: a plain parse


def test_lines_per_key_are_bounded() -> None:
    reuse = Reuse(1 << 30, lines_per_key=2)
    for n in range(4):
        reuse.parse("k", _body([_message(0, f"sub-agent {n} " * 20)]), "messages")
    assert reuse.entries == 2


edits = st.lists(
    st.tuples(st.sampled_from(["grow", "rewind", "fork", "resend", "unmark"]), st.integers(0, 5)),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(edits)
def test_any_sequence_of_edits_parses_as_a_full_parse(steps: list[tuple[str, int]]) -> None:
    reuse = Reuse(1 << 30, lines_per_key=3)
    line: list[Any] = [_message(0)]
    for n, (edit, size) in enumerate(steps):
        marker = True
        if edit == "grow":
            line = [*line, *(_message(len(line) + k) for k in range(size + 1))]
        elif edit == "rewind":
            line = line[: max(1, len(line) - size)]
        elif edit == "fork":
            line = [*line[: max(1, len(line) - size)], _message(1, f"fork {n}")]
        elif edit == "unmark":
            marker = False
        raw = _body(line, marker)
        payload, _ = reuse.parse("k", raw, "messages")
        assert payload == orjson.loads(raw)
