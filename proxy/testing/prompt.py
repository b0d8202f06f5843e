"""What the stand-in reads of a request, whatever its API: a neutral transcript.

Each API's reader (`Api.read` in api_*.py) turns a valid body into a `Prompt`: entries
(messages or items) of ordered parts (text, tool calls, tool results), the client tools
offered, the output limit. The script, the scenario and the summariser read only this,
so what they decide is the same for every API.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.testing.reply import Call

READ_RESULT = "read_result"
STUB_REF = re.compile(r'read_result\(ref="(r_[0-9a-f]{16,})"')

TURN = "turn"  # an ordinary request
SUMMARY = "summary"  # a request asking for a summary of its history (by its wording)
COMPACTION = "compaction"  # Codex's compaction_trigger: a compaction item is asked for


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Result:
    """A tool result: the call it answers and its texts."""

    call_id: str
    texts: tuple[str, ...]


Part = Text | Call | Result


@dataclass(frozen=True)
class Entry:
    role: str  # "user" (tool results included), "assistant" or "system"
    parts: tuple[Part, ...]


@dataclass(frozen=True)
class Prompt:
    # The entries are read when first asked for: most answers need only the tools and
    # the limits, and reading a long history on every request costs the stand-in's time.
    reader: Callable[[], Iterable[Entry]] = field(repr=False, compare=False)
    size: int  # how many messages (or items) the request holds
    tools: tuple[str, ...]  # the client tools offered, by name, in order
    max_output: int  # the answer's limit in tokens (the API's default when unset)
    summary_budget: int  # a summary's limit: the request's own, else 1024
    reasoning: bool = False  # the request lets the model think before it answers
    asks: str = TURN
    schema: Mapping[str, Any] | None = None  # the JSON schema the answer must follow

    @functools.cached_property
    def entries(self) -> tuple[Entry, ...]:
        return tuple(self.reader())


def texts(entry: Entry) -> Iterator[str]:
    """The entry's texts, its tool results' included, in order."""
    for part in entry.parts:
        if isinstance(part, Text):
            yield part.text
        elif isinstance(part, Result):
            yield from part.texts


def last_user_text(prompt: Prompt) -> str:
    """The text the newest user entry says (its tool results aside)."""
    for entry in reversed(prompt.entries):
        if entry.role == "user":
            return "\n".join(p.text for p in entry.parts if isinstance(p, Text))
    return ""


def stub_refs(prompt: Prompt) -> list[str]:
    """Refs the history's stubs name, first seen first, each once."""
    refs: dict[str, None] = {}
    for entry in prompt.entries:
        for text in texts(entry):
            for ref in STUB_REF.findall(text):
                refs.setdefault(ref, None)
    return list(refs)


def next_ref_to_read(prompt: Prompt, keep_reading: bool = False) -> str | None:
    """The first stub ref not read yet, when read_result is offered and the request is not
    itself answering a read (unless `keep_reading`: a model that reads every stub)."""
    if READ_RESULT not in prompt.tools:
        return None
    read_calls: dict[str, str] = {}  # call id -> ref
    for entry in prompt.entries:
        for part in entry.parts:
            if isinstance(part, Call) and part.name == READ_RESULT:
                ref = part.input.get("ref") if isinstance(part.input, dict) else None
                read_calls[str(part.id)] = str(ref)
    last_user = next((e for e in reversed(prompt.entries) if e.role == "user"), None)
    answering = last_user is not None and any(
        isinstance(p, Result) and p.call_id in read_calls for p in last_user.parts
    )
    if answering and not keep_reading:
        return None
    already = set(read_calls.values())
    return next((ref for ref in stub_refs(prompt) if ref not in already), None)
