"""The client's JSON, passed on exactly.

orjson reads an integer beyond 64 bits as a float, and writes floats, escapes and spaces
its own way: a body re-serialised from what was parsed can differ from what the client
sent, a number's value included. A rewrite replaces a few top-level fields of a body and
keeps most of what is in them (messages, blocks, tools); `ClientJSON.encode` writes what
is kept as the client's own bytes:

- when orjson writes the parsed body back byte for byte (`canonical`: what agents and the
  SDKs send, compact JSON), it writes every value in it as the client did, so the
  rewritten body is simply serialised;
- otherwise every value of the result that is the very object parsed from the body is
  copied from the body's bytes, found by walking the body's containers as far as the
  result's own containers were built from them (a message rebuilt as `{**message, ...}`
  still finds its kept blocks); only what the proxy made, and what it cannot trace, is
  serialised.

A span is used only for the object that was parsed from it (an identity check), so the
output is always a correct rendering of the value it was given. Locating a container's
children costs one orjson call per child when the child's bytes are what orjson writes,
and a scan of its bytes (strings skipped by a regex, brackets counted) otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

_WHITESPACE = re.compile(rb"[ \t\n\r]*")
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_STRING_OR_BRACKET = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_SCALAR = re.compile(rb"[^ \t\n\r,\]}]+")  # a number or a literal: up to a delimiter
_QUOTE, _COMMA = 0x22, 0x2C
_OPEN_OBJECT, _CLOSE_OBJECT, _OPEN_ARRAY, _CLOSE_ARRAY = 0x7B, 0x7D, 0x5B, 0x5D
_OPENERS = (_OPEN_OBJECT, _OPEN_ARRAY)
_SELF_DELIMITED = (_QUOTE, _OPEN_OBJECT, _OPEN_ARRAY)
_DELIMITERS = frozenset(b" \t\n\r,]}")
_WHITESPACE_BYTES = frozenset(b" \t\n\r")
_HINTED_DEPTH = 32  # below this, a value's end is found by counting its brackets

# What `ClientJSON.encode_kept` wrote, by the id of the container it wrote (held with it).
Written = dict[int, tuple[object, bytes]]


def _once(value: Any, kept: Written, now: Written) -> bytes:
    """orjson's writing of `value`, kept with it when it is a container (found in `kept`
    for the very object, else made), and kept in `now`."""
    if not isinstance(value, (dict, list)):
        return orjson.dumps(value)
    found = kept.get(id(value))
    written = found[1] if found is not None and found[0] is value else orjson.dumps(value)
    now[id(value)] = (value, written)
    return written


class ClientJSON:
    """A request body as the client sent it (`raw`) and as orjson parsed it (`parsed`)."""

    __slots__ = (
        "_canonical",
        "_encodable",
        "_expanded",
        "_owners",
        "_spans",
        "_written",
        "parsed",
        "raw",
    )

    def __init__(
        self,
        raw: bytes,
        parsed: Mapping[str, Any],
        canonical: bool | None = None,
        written: Written | None = None,
    ) -> None:
        """`canonical`: already known (the reuse cache proves it where it knows where each
        message lies: proxy/core/reuse.py); None: found on first need. `written`: what
        `encode_kept` wrote for the line's last rewrite (the reuse cache's), None: none."""
        self.raw = raw
        self.parsed = parsed
        self._canonical: bool | None = canonical
        self._written = written
        self._encodable = True
        # id(object parsed from raw) -> (the object, its span): the object is held so that
        # its id is never reused while the span is known.
        self._spans: dict[int, tuple[object, int, int]] = {}
        self._expanded: set[int] = set()  # containers whose children's spans are known
        self._owners: dict[int, dict[int, dict[str, Any]]] = {}  # per list: value id -> element

    @classmethod
    def written(cls, parsed: Mapping[str, Any], kept: Written | None = None) -> ClientJSON:
        """A body held only parsed (the simulator, tests): as orjson writes it."""
        source = cls(orjson.dumps(parsed), parsed, written=kept)
        source._canonical = True
        return source

    @property
    def canonical(self) -> bool:
        """Whether orjson writes the parsed body back as the client's bytes (then it writes
        every value in it so); False also when it cannot write it at all (nested deeper
        than its limit of 255 levels)."""
        if self._canonical is None:
            try:
                self._canonical = orjson.dumps(self.parsed) == self.raw
            except orjson.JSONEncodeError:
                self._canonical = self._encodable = False
        return self._canonical

    @property
    def encodable(self) -> bool:
        """Whether orjson can write the parsed body at all: it refuses values nested deeper
        than 255 levels (it reads up to 1024), and what the proxy builds from a history
        (counts, summaries, transcripts) serialises parts of it."""
        return self.canonical or self._encodable

    def encode(self, value: Any) -> bytes:
        """`value` as JSON bytes: a body built from the parsed one (its kept parts the very
        objects parsed), written with what it kept as the client's bytes."""
        if self.canonical:
            return orjson.dumps(value)
        if not self._spans:  # the body itself, between any whitespace around it
            start = _skip_whitespace(self.raw, 0)
            self._spans[id(self.parsed)] = (self.parsed, start, len(self.raw.rstrip()))
        out: list[bytes] = []
        self._write(value, self.parsed, out)
        return b"".join(out)

    def encode_kept(self, value: Mapping[str, Any]) -> bytes:
        """`encode(value)` for a rewrite of the body (an object), writing each container
        in it (a message, a tool, the system prompt) that the line's last rewrite held
        once: orjson writes an object or a list as its members' writings joined, so the
        bytes kept with the very object (an identity check) are what it would write
        again. What this rewrite holds is kept for the next (nothing else: the memory is
        one rewrite's bytes); the objects of a parsed body are never changed in place."""
        kept = self._written
        if kept is None or not self.canonical:
            return self.encode(value)
        now: Written = {}
        fields = []
        for key, child in value.items():
            if isinstance(child, list):
                written = b"[" + b",".join(_once(item, kept, now) for item in child) + b"]"
            else:
                written = _once(child, kept, now)
            fields.append(orjson.dumps(key) + b":" + written)
        kept.clear()
        kept.update(now)
        return b"{" + b",".join(fields) + b"}"

    def _copied(self, value: Any, out: list[bytes]) -> bool:
        """Write `value` as the client's bytes if it was parsed from a span known."""
        known = self._spans.get(id(value))
        if known is None or known[0] is not value:
            return False
        out.append(self.raw[known[1] : known[2]])
        return True

    def _write(self, value: Any, origin: Any, out: list[bytes]) -> None:
        if self._copied(value, out):
            return
        if isinstance(value, dict):
            parent = origin if isinstance(origin, dict) else None
            if parent is not None:
                self._expand(parent)
            out.append(b"{")
            for n, (key, child) in enumerate(value.items()):
                if n:
                    out.append(b",")
                out.append(orjson.dumps(key))
                out.append(b":")
                self._write(child, parent.get(key) if parent is not None else None, out)
            out.append(b"}")
        elif isinstance(value, list):
            elements = origin if isinstance(origin, list) else None
            if elements is not None:
                self._expand(elements)
            out.append(b"[")
            for n, child in enumerate(value):
                if n:
                    out.append(b",")
                if self._copied(child, out):
                    continue
                derived = None
                if elements is not None and isinstance(child, dict):
                    derived = self._owner(elements, child)
                self._write(child, derived, out)
            out.append(b"]")
        else:
            out.append(orjson.dumps(value))

    def _owner(self, elements: list[Any], value: dict[str, Any]) -> dict[str, Any] | None:
        """The element of `elements` that `value` was built from (`{**element, ...}`): the
        one holding one of its values, the very object (strings, floats and containers
        parsed are objects of their own; short strings and other scalars may be shared)."""
        owners = self._owners.get(id(elements))
        if owners is None:
            owners = {}
            for element in elements:
                if isinstance(element, dict):
                    for child in element.values():
                        if _distinct(child):
                            owners[id(child)] = element
            self._owners[id(elements)] = owners
        for child in value.values():
            found = owners.get(id(child)) if _distinct(child) else None
            if found is not None:  # (a live object's id is its own)
                return found
        return None

    def _expand(self, container: dict[str, Any] | list[Any]) -> None:
        """Learn the spans of a parsed container's children (once), from its own span."""
        key = id(container)
        if key in self._expanded:
            return
        known = self._spans.get(key)
        if known is None or known[0] is not container:
            return  # not traced to the body's bytes: its children are serialised
        self._expanded.add(key)
        raw = self.raw
        if isinstance(container, dict):
            spans: dict[str, tuple[int, int]] = {}  # the last of a duplicated key wins
            for name, start, end in _members(raw, known[1], container)[0]:
                spans[name] = (start, end)
            for name, (start, end) in spans.items():
                if name in container:
                    child = container[name]
                    self._spans[id(child)] = (child, start, end)
        else:
            found = _elements(raw, known[1], container)[0]
            if len(found) == len(container):
                for child, (start, end) in zip(container, found, strict=True):
                    self._spans[id(child)] = (child, start, end)


def _distinct(value: object) -> bool:
    """Whether a parsed value is an object no other place in the body shares."""
    if isinstance(value, str):
        return len(value) > 1  # "" and one-character strings may be interned
    return isinstance(value, (dict, list, float))


def _skip_whitespace(raw: bytes, pos: int) -> int:
    if pos < len(raw) and raw[pos] not in _WHITESPACE_BYTES:
        return pos  # compact JSON: no call
    return _WHITESPACE.match(raw, pos).end()  # type: ignore[union-attr]


def _members(
    raw: bytes, start: int, hint: dict[str, Any], depth: int = 0
) -> tuple[list[tuple[str, int, int]], int]:
    """(name, value start, value end) of each member of the object starting at `start`,
    and where the object ends. `hint` is what was probably parsed from it."""
    found: list[tuple[str, int, int]] = []
    pos = _skip_whitespace(raw, start + 1)
    if raw[pos] == _CLOSE_OBJECT:
        return found, pos + 1
    while True:
        name_match = _STRING.match(raw, pos)
        if name_match is None:
            raise ValueError(f"no member name at byte {pos}")
        name = orjson.loads(name_match.group())
        pos = _skip_whitespace(raw, name_match.end())
        pos = _skip_whitespace(raw, pos + 1)  # past ':'
        end = _value_end(raw, pos, hint.get(name), depth)
        found.append((name, pos, end))
        pos = _skip_whitespace(raw, end)
        if raw[pos] != _COMMA:
            return found, pos + 1
        pos = _skip_whitespace(raw, pos + 1)


def _elements(
    raw: bytes, start: int, hint: list[Any], depth: int = 0
) -> tuple[list[tuple[int, int]], int]:
    """(start, end) of each element of the array starting at `start`, and where the array
    ends. `hint` is what was probably parsed from it."""
    found: list[tuple[int, int]] = []
    pos = _skip_whitespace(raw, start + 1)
    if raw[pos] == _CLOSE_ARRAY:
        return found, pos + 1
    while True:
        likely = hint[len(found)] if len(found) < len(hint) else None
        end = _value_end(raw, pos, likely, depth)
        found.append((pos, end))
        pos = _skip_whitespace(raw, end)
        if raw[pos] != _COMMA:
            return found, pos + 1
        pos = _skip_whitespace(raw, pos + 1)


def _value_end(raw: bytes, pos: int, likely: object, depth: int = 0) -> int:
    """Where the JSON value starting at `pos` ends. `likely` is the value probably parsed
    from it: where orjson writes it as these very bytes, that proves the end at once;
    where not (a big integer somewhere inside), its children are tried the same way, so
    only the odd part is scanned byte by byte."""
    if likely is not None:
        try:
            written = orjson.dumps(likely)
        except orjson.JSONEncodeError:
            written = b""
        if written and raw.startswith(written, pos):
            end = pos + len(written)
            if written[0] in _SELF_DELIMITED or end == len(raw) or raw[end] in _DELIMITERS:
                return end
    first = raw[pos]
    if first == _QUOTE:
        return _STRING.match(raw, pos).end()  # type: ignore[union-attr]
    if depth < _HINTED_DEPTH:
        if first == _OPEN_OBJECT and isinstance(likely, dict):
            return _members(raw, pos, likely, depth + 1)[1]
        if first == _OPEN_ARRAY and isinstance(likely, list):
            return _elements(raw, pos, likely, depth + 1)[1]
    if first in _OPENERS:
        return _scanned_end(raw, pos)
    return _SCALAR.match(raw, pos).end()  # type: ignore[union-attr]


def _scanned_end(raw: bytes, pos: int) -> int:
    """Where the object or array starting at `pos` ends: its brackets counted, strings
    skipped (no recursion: any depth orjson reads)."""
    depth = 0
    for token in _STRING_OR_BRACKET.finditer(raw, pos):
        kind = raw[token.start()]
        if kind == _QUOTE:
            continue
        depth += 1 if kind in _OPENERS else -1
        if depth == 0:
            return token.end()
    raise ValueError(f"unclosed value at byte {pos}")
