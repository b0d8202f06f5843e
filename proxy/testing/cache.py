"""The stand-in's model of Anthropic prompt caching, for usage figures a policy can be priced by.

The prompt is read as a sequence of *units* in the API's prefix order: each tool
definition, then each system block, then each content block of each message (a string
content is one unit). Unit k has a *prefix hash*: a hash chained over the model name and
units 0..k, each unit as canonical JSON without its `cache_control` (moving a breakpoint
does not change the content before it) and, for messages, with its message index and role.
A deferred tool (`defer_loading: true`, tool search) is not in the prefix: its unit is the
one before it again (same hash and count), and its tokens count at the block whose
`tool_reference` first loads it, as the API puts it there (`_Loads`).
Unit k also has a cumulative token count: the project's counter's count of the prompt up to
and including unit k, so the last unit's count is `count_request(body)`.

A *breakpoint* is a unit carrying `cache_control` (a top-level `cache_control` puts one on
the last unit). Per credential, the cache maps prefix hashes to an expiry time:

- read: for each breakpoint, the units from it back to 20 units before it (the API's
  lookback) are looked up; the longest prefix found unexpired is read:
  `cache_read_input_tokens` = its cumulative count, and its expiry is refreshed;
- write: the prefix up to the last breakpoint, if longer than what was read and at least
  `min_tokens` long, is written: `cache_creation_input_tokens` = its count minus the read
  count; every breakpoint at least `min_tokens` long is (re)stored with a fresh expiry;
- `input_tokens` is the rest of the prompt, after the last read or written prefix.

TTL is the breakpoint's `ttl` ("1h" -> 3600 s) or the configured default (300 s), on a
monotonic clock. Exact prefixes only: any change before a breakpoint misses, as in the API.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.deep_json import sorted_json
from proxy.core.tokens import TokenCounter, referenced_tools
from proxy.wire.anthropic_validation import cache_control_count

LOOKBACK_UNITS = 20
ONE_HOUR = 3600.0


@dataclass(frozen=True)
class Unit:
    prefix_hash: bytes
    cumulative_tokens: int
    ttl: str | None  # "5m" / "1h" when the unit is a breakpoint, else None
    breakpoint: bool


@dataclass(frozen=True)
class CacheUsage:
    input_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    creation_1h: bool  # whether the written prefix was a one-hour entry

    def as_usage(self) -> dict[str, Any]:
        write = self.cache_creation_input_tokens
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": write,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": 0 if self.creation_1h else write,
                "ephemeral_1h_input_tokens": write if self.creation_1h else 0,
            },
        }


def _canonical(value: Any) -> bytes:
    if isinstance(value, dict) and "cache_control" in value:
        value = {k: v for k, v in value.items() if k != "cache_control"}
    return _sorted(value)


def _sorted(value: Any) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except TypeError:  # nested deeper than orjson writes (255 levels)
        return sorted_json(value)


def _ttl_of(block: Any) -> str | None:
    if not isinstance(block, dict):
        return None
    control = block.get("cache_control")
    if not control:
        return None
    ttl = control.get("ttl") if isinstance(control, dict) else None
    return ttl if isinstance(ttl, str) else "5m"


def prompt_units(body: dict[str, Any], counter: TokenCounter) -> list[Unit]:
    """The prompt's units in prefix order; see the module docstring.

    A prompt without any cache_control has no use for them: it gets none.
    """
    units: list[Unit] = []
    if not cache_control_count(body):
        return units
    digest = hashlib.sha256(b"model\0" + str(body.get("model")).encode()).digest()

    def add(tag: bytes, block: Any, cumulative: int) -> None:
        nonlocal digest
        digest = hashlib.sha256(digest + tag + b"\0" + _canonical(block)).digest()
        ttl = _ttl_of(block)
        units.append(Unit(digest, cumulative, ttl, ttl is not None))

    tools = body.get("tools") or []
    running = 0
    for tool in tools:
        if _deferred(tool):  # not in the prefix: the unit before it, again
            ttl = _ttl_of(tool)
            units.append(Unit(digest, running, ttl, ttl is not None))
            continue
        # count_tools is a preamble plus a cost per tool: one call per tool.
        first = counter.count_tools([tool])
        running += first if running == 0 else counter.count_tools([tool, tool]) - first
        add(b"tool", tool, running)
    plain = [t for t in tools if not _deferred(t)]
    base = counter.count_tools(plain)
    loads = _Loads(body, plain, counter)

    system = body.get("system")
    if isinstance(system, str) and system:
        add(b"system", {"type": "text", "text": system}, base + counter.count_text(system))
    elif isinstance(system, list):
        running = base
        for block in system:
            running += counter.count_block(block)
            add(b"system", block, running)
    base += counter.count_system(system)

    for i, message in enumerate(body.get("messages") or []):
        role = str(message.get("role"))
        content = message.get("content")
        running = base + counter.count_message({"role": role, "content": []})
        tag = f"message\0{i}\0{role}".encode()
        if isinstance(content, str):
            running = base + counter.count_message(message)
            add(tag, {"type": "text", "text": content}, running)
        elif isinstance(content, list):
            for block in content:
                running += counter.count_block(block) + loads.tokens_at(block)
                add(tag, block, running)
        base = running

    if body.get("cache_control") and units:
        last = units[-1]
        units[-1] = Unit(last.prefix_hash, last.cumulative_tokens, _ttl_of(body) or "5m", True)
    return units


def _deferred(tool: object) -> bool:
    return isinstance(tool, dict) and tool.get("defer_loading") is True


class _Loads:
    """Where the deferred tools (tool search) a request loads enter its prompt. The API
    leaves a deferred tool out of the tools' prefix and puts its definition where a
    `tool_reference` names it, so adding a deferred tool to `tools`, or loading one,
    changes no earlier unit (Anthropic's "Tool use with prompt caching": "the prefix is
    untouched"). Its tokens (what `count_request` counts for it among the tools) are
    counted at the first block that references it; a deferred tool no block references
    adds none."""

    def __init__(self, body: dict[str, Any], tools: list[Any], counter: TokenCounter) -> None:
        listed = body.get("tools")
        self._waiting = {
            t["name"]: t
            for t in (listed if isinstance(listed, list) else [])
            if _deferred(t) and isinstance(t.get("name"), str)
        }
        self._shown = list(tools)
        self._counter = counter

    def tokens_at(self, block: Any) -> int:
        if not self._waiting or not isinstance(block, dict):
            return 0
        added = 0
        for name in sorted(referenced_tools([{"content": [block]}])):
            tool = self._waiting.pop(name, None)
            if tool is not None:
                before = self._counter.count_tools(self._shown)
                self._shown.append(tool)
                added += self._counter.count_tools(self._shown) - before
        return added


def prefix_units(
    model: bytes, pieces: list[tuple[bytes, Any, int]], *, every_boundary: bool
) -> list[Unit]:
    """Units of a prompt an API caches by prefix by itself (OpenAI's): each piece (tag,
    value, cumulative tokens) chained on the ones before it. `every_boundary`: each piece
    ends a breakpoint (the closest whole-piece model of longest-prefix caching); else only
    the last one does."""
    digest = hashlib.sha256(model).digest()
    units = []
    for n, (tag, value, cumulative) in enumerate(pieces):
        digest = hashlib.sha256(digest + tag + b"\0" + _sorted(value)).digest()
        marked = every_boundary or n == len(pieces) - 1
        units.append(Unit(digest, cumulative, "5m" if marked else None, marked))
    return units


class PromptCache:
    """Cached prefixes per credential, with expiry; see the module docstring."""

    def __init__(
        self,
        ttl_seconds: float = 300.0,
        min_tokens: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.min_tokens = min_tokens
        self._clock = clock
        self._entries: dict[str, dict[bytes, float]] = {}  # tenant -> prefix hash -> expiry

    def _ttl(self, ttl: str | None) -> float:
        return ONE_HOUR if ttl == "1h" else self.ttl_seconds

    def account(self, tenant: str, units: list[Unit], total_tokens: int) -> CacheUsage:
        """Usage of one request, updating the cache as the API would."""
        now = self._clock()
        entries = self._entries.setdefault(tenant, {})
        for key in [k for k, expiry in entries.items() if expiry <= now]:
            del entries[key]

        breakpoints = [k for k, unit in enumerate(units) if unit.breakpoint]
        read_at = -1
        for b in breakpoints:
            for k in range(b, max(-1, b - LOOKBACK_UNITS - 1), -1):
                if k > read_at and units[k].prefix_hash in entries:
                    read_at = k
                    break
        read = units[read_at].cumulative_tokens if read_at >= 0 else 0
        if read_at >= 0:
            old = entries[units[read_at].prefix_hash]
            entries[units[read_at].prefix_hash] = max(old, now + self.ttl_seconds)

        written = 0
        creation_1h = False
        for b in breakpoints:
            unit = units[b]
            if unit.cumulative_tokens < self.min_tokens:
                continue
            expiry = now + self._ttl(unit.ttl)
            entries[unit.prefix_hash] = max(entries.get(unit.prefix_hash, 0.0), expiry)
            if b > read_at:
                written = unit.cumulative_tokens - read
                creation_1h = unit.ttl == "1h"
        read = min(read, total_tokens)
        written = max(0, min(written, total_tokens - read))
        return CacheUsage(total_tokens - read - written, written, read, creation_1h)
