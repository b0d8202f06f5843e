"""Work in proportion to what is new (docs/design.md#work-in-proportion-to-what-is-new):
what was computed for a conversation's last request, kept for its next one.

An agent resends its whole history with every request, and its next request repeats the
bytes of the last one up to its newest turns (Claude Code also moves one cache marker off
the message that was last). Per conversation and line, `Reuse` keeps the last request's
bytes, its parsed body and what was computed for each of its messages (`Known`: the
count key, the match digest; `Seen`). The next request is compared with it byte for
byte (proxy/core/unchanged.py); the messages whose bytes it repeats are the very objects
parsed before, with what was computed for them, and only the bytes after them are parsed,
serialised, hashed and counted.

Why the result is what a full parse gives: where the last request's bytes were orjson's
own writing of what it parsed (`Layout`: what Claude Code and the SDKs send), the offset
of every message is known. The next request must repeat the bytes before the history
list and after it (every other field) exactly, and the messages whose bytes lie in the
shared start; the bytes between are parsed as the list's remaining elements (a JSON value
parses the same wherever it stands, and a fragment that is not a list of values is a
miss). A miss parses the whole body, as without this module.

The parsed objects of a kept request are shared with the next request's body: nothing
may change a parsed body in place (the rewrite builds new containers).

Memory is bounded: `max_bytes` of bodies (their parsed objects counted as
PARSED_FACTOR times their bytes), least recently used line evicted first; `lines_per_key`
lines per conversation (a rewind, a fork, sub-agents sharing a session id).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.core.unchanged import common_prefix
from proxy.core.validated import Validated

# Bytes a parsed body and its per-message facts take, per byte of JSON (measured on the
# recorded Claude Code session: 1.27 for the parsed body alone).
PARSED_FACTOR = 2.5
LINES_PER_KEY = 8
# Bytes of a body that name a conversation without a client id (its first messages).
KEY_BYTES = 1024


@dataclass(slots=True)
class Known:
    """What was computed for one message, while its object is reused."""

    message: object  # held, so that its id stays its own
    size: int = -1  # bytes of its JSON (-1: not made yet)
    sourced: bool = False  # its JSON holds a `source` (an image or document)
    form: int = 0  # digests.Canonical.form
    breakpoints: int = 0
    key: Any = None  # its count key (tokens.CountKey), None until made
    exact: int | None = None  # its exact count, once made or found
    guess: int | None = None  # its estimate (proxy/core/estimate.py), once made
    guessed: bool = False  # whether `guess` was made (None then: it is not estimated)
    digest: bytes | None = None  # its match digest, None until made
    json: bytes | None = None  # what the digest is of, kept until the digest is made
    raw: bytes | None = None  # its JSON when made while parsing, until counting takes it
    tool_refs: frozenset[str] | None = None  # the tools its tool_reference blocks load


@dataclass(slots=True)
class Layout:
    """Where the history list sits in a body orjson writes back byte for byte."""

    head: int  # bytes before the first element
    tail: int  # bytes from the list's closing bracket to the end
    ends: list[int]  # where each element ends (exclusive)


@dataclass(slots=True)
class Seen:
    """One line's last request: its bytes, its parsed body, what was computed for it."""

    raw: bytes
    payload: dict[str, Any]
    list_key: str  # the field holding the history ("messages", "input")
    layout: Layout | None = None  # None: not known yet (or not orjson's writing)
    layout_tried: bool = False
    known: dict[int, Known] = field(default_factory=dict)  # by the message's id
    # Values computed from parts that stay the same objects between requests (the system
    # prompt, the tools): name -> (those objects, what else they depend on, the value).
    fixed: dict[str, tuple[tuple[object, ...], object, Any]] = field(default_factory=dict)
    # What the planner built of the line's segments (working.BuiltMemo).
    built: dict[int, Any] = field(default_factory=dict)
    # The histories the line's validations found valid (proxy/core/validated.py).
    validated: Validated = field(default_factory=Validated)
    # What the line's last rewrite was written of (exact_json.ClientJSON.encode_kept).
    written: dict[int, tuple[object, bytes]] = field(default_factory=dict)
    reused: int = 0  # messages this request took from the one before
    # Bytes of `raw` from the history's start known to hold no `"source"` (an image or a
    # document: the quiet check's search, proxy/server/compactor.py); 0: none known.
    unsourced: int = 0

    @property
    def cost(self) -> int:
        return int(len(self.raw) * PARSED_FACTOR)

    def known_of(self, message: object) -> Known:
        """The facts of one of this body's messages (made empty on first ask)."""
        found = self.known.get(id(message))
        if found is None or found.message is not message:
            found = self.known[id(message)] = Known(message)
        return found

    def fixed_value(self, name: str, parts: tuple[object, ...], also: object = None) -> Any:
        """A value kept for these very objects and an equal `also` (None: none)."""
        found = self.fixed.get(name)
        if found is None or len(found[0]) != len(parts) or found[1] != also:
            return None
        if all(a is b for a, b in zip(found[0], parts, strict=True)):
            return found[2]
        return None

    def keep_fixed(
        self, name: str, parts: tuple[object, ...], value: Any, also: object = None
    ) -> None:
        self.fixed[name] = (parts, also, value)


@dataclass
class ReuseStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    reused_bytes: int = 0  # bytes of requests not parsed again


class Reuse:
    """The bounded cache of `Seen` lines, by conversation key."""

    def __init__(self, max_bytes: int, lines_per_key: int = LINES_PER_KEY) -> None:
        self.max_bytes = max_bytes
        self.lines_per_key = max(1, lines_per_key)
        self._lines: OrderedDict[Any, list[Seen]] = OrderedDict()
        self.bytes = 0
        self.stats = ReuseStats()

    @property
    def entries(self) -> int:
        return sum(len(lines) for lines in self._lines.values())

    def parse(self, key: Any, raw: bytes, list_key: str) -> tuple[Any, Seen | None]:
        """The body parsed (orjson.loads' value), reusing the line it continues; and the
        `Seen` kept for it (None: the cache is off or the body is not an object)."""
        if self.max_bytes <= 0:
            return orjson.loads(raw), None
        lines = self._lines.get(key)
        best, shared = None, 0
        for seen in lines or ():
            at = common_prefix(seen.raw, raw)
            if at > shared:
                best, shared = seen, at
        continued = _continued(best, shared, raw) if best is not None else None
        if continued is None:
            self.stats.misses += 1
            payload = orjson.loads(raw)
            if not isinstance(payload, dict):
                return payload, None
            seen = Seen(raw, payload, list_key)
        else:
            seen = continued
            self.stats.hits += 1
            self.stats.reused_bytes += shared
        # It continues that line when it repeats a whole message of it (else, say, another
        # sub-agent's first request: a line of its own).
        self._keep(key, seen, best if seen.reused else None)
        return seen.payload, seen

    def _keep(self, key: Any, seen: Seen, replaces: Seen | None) -> None:
        lines = self._lines.pop(key, None) or []
        if replaces is not None and replaces in lines:
            lines.remove(replaces)
            self.bytes -= replaces.cost
        lines.append(seen)  # the most recent line last
        self.bytes += seen.cost
        while len(lines) > self.lines_per_key:
            self.bytes -= lines.pop(0).cost
            self.stats.evictions += 1
        self._lines[key] = lines
        while self.bytes > self.max_bytes and self._lines:
            oldest_key = next(iter(self._lines))
            oldest = self._lines[oldest_key]
            self.bytes -= oldest.pop(0).cost
            self.stats.evictions += 1
            if not oldest:
                del self._lines[oldest_key]


def _continued(before: Seen, shared: int, raw: bytes) -> Seen | None:
    """The new request parsed as `before` plus its new messages, or None (a miss)."""
    layout = _layout_of(before)
    if layout is None or shared < layout.head:
        return None
    old = before.raw
    if not raw.endswith(memoryview(old)[len(old) - layout.tail :]):
        return None  # the fields after the history changed
    messages = before.payload.get(before.list_key)
    if not isinstance(messages, list) or len(messages) != len(layout.ends):
        return None
    kept = bisect.bisect_right(layout.ends, shared)
    start = layout.ends[kept - 1] if kept else layout.head
    end = len(raw) - layout.tail
    if end < start:
        return None
    region = raw[start:end]
    fresh: list[Any] = []
    if region:
        inner = region
        if kept:  # the bytes after a kept message: a comma, then the new ones
            if region[:1] != b",":
                return None
            inner = region[1:]
        try:
            fresh = orjson.loads(b"[" + inner + b"]")
        except orjson.JSONDecodeError:
            return None
    payload = dict(before.payload)
    repeated = messages[:kept]
    payload[before.list_key] = [*repeated, *fresh]
    known, was = {}, before.known
    for message in repeated:
        found = was.get(id(message))
        if found is not None:
            known[id(message)] = found
    built = before.built
    seen = Seen(
        raw,
        payload,
        before.list_key,
        layout_tried=True,
        known=known,
        fixed=before.fixed,
        built=_still_built(built, {id(m) for m in repeated}) if built else {},
        validated=before.validated,
        written=before.written,
        reused=kept,
        # (the bytes up to the new messages are the last request's)
        unsourced=min(before.unsourced, start),
    )
    try:
        written = [orjson.dumps(m) for m in fresh]
    except orjson.JSONEncodeError:  # nested deeper than orjson writes: no layout
        return seen
    seen.layout = _extended(layout, kept, written, region, len(raw))
    for message, made in zip(fresh, written, strict=True):
        seen.known_of(message).raw = made  # counting would make it again
    return seen


def _still_built(built: dict[int, Any], kept: set[int]) -> dict[int, Any]:
    """What was built of the kept messages and of segments over them (or over none)."""
    out = {}
    for key, entry in built.items():
        anchor, source = entry[0], entry[1]
        if id(source if source is not None else anchor) in kept or (
            source is None and not isinstance(anchor, dict)
        ):
            out[key] = entry
    return out


def _extended(
    layout: Layout, kept: int, written: Sequence[bytes], region: bytes, size: int
) -> Layout | None:
    """The new body's layout: the kept messages' ends, and the new ones' when the region
    is orjson's writing of them (`written`; else unknown: the next request parses in
    full)."""
    expected = b",".join(written)
    if kept and written:
        expected = b"," + expected
    if region != expected:
        return None
    ends = layout.ends[:kept]
    at = ends[-1] if ends else layout.head
    for n, piece in enumerate(written):
        at += len(piece) + (1 if (kept or n) else 0)
        ends.append(at)
    return Layout(layout.head, layout.tail, ends) if size - at == layout.tail else None


def _layout_of(seen: Seen) -> Layout | None:
    """Where the history list sits in `seen`'s bytes, found once: its body written back
    by orjson in parts (the fields before the list, each message, the fields after) and
    compared with the bytes received."""
    if seen.layout_tried:
        return seen.layout
    seen.layout_tried = True
    payload, name = seen.payload, seen.list_key
    messages = payload.get(name)
    if not isinstance(messages, list) or name not in payload:
        return None
    keys = list(payload)
    at = keys.index(name)
    try:
        before = orjson.dumps({k: payload[k] for k in keys[:at]})
        after = orjson.dumps({k: payload[k] for k in keys[at + 1 :]})
        written = [orjson.dumps(m) for m in messages]
    except orjson.JSONEncodeError:
        return None
    head = (before[:-1] + b"," if at else b"{") + orjson.dumps(name) + b":["
    tail = b"]" + (b"," + after[1:] if len(keys) > at + 1 else b"}")
    raw = seen.raw
    if not (raw.startswith(head) and raw.endswith(tail)):
        return None
    if raw[len(head) : len(raw) - len(tail)] != b",".join(written):
        return None
    ends, end = [], len(head)
    for n, piece in enumerate(written):
        end += len(piece) + (1 if n else 0)
        ends.append(end)
    seen.layout = Layout(len(head), len(tail), ends)
    return seen.layout


def key_of(tenant: str, conversation: str | None, raw: bytes) -> tuple[str, str | bytes]:
    """A line's key: the tenant and the conversation id the client sent in a header
    (identity.header_id), or without one the body's first KEY_BYTES, which stay the same
    as a conversation grows."""
    if conversation:
        return tenant, conversation
    return tenant, raw[:KEY_BYTES]
