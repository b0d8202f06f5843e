"""Offload: a large tool result becomes a stub, and the model can read the rest back.

The stub keeps the head of the text and says, in words the model can act on, how long
the whole is and how to call the injected `read_result` tool for more. Refs are named by
a hash of the content, so the same result gives the same stub on every replica and
every request (the upstream prompt cache depends on it).

This module holds the words and the rules, in no API's shape: a result is a
`ToolResult`, a stub is `Stub` plus `stub_text`, the tool is its description and
`read_result_schema`. Each format (proxy/wire/) finds the results in its messages and
builds the stubbed message and the tool definition in its own shape.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

TOOL_NAMES = ("read_result", "compaction_proxy_read_result")
MAX_READ_CHARS = 32_000


def free_tool_name(taken: Collection[object]) -> str | None:
    """The name to inject under: the first of TOOL_NAMES the client does not use itself
    (`taken`: the names of the request's tools, as its format finds them).

    A client tool already called `read_result` is the client's; we never shadow it. When
    every name is taken, offloading is off for the request (None).
    """
    return next((name for name in TOOL_NAMES if name not in taken), None)


READ_RESULT_DESCRIPTION = (
    "Read part of a tool result that was offloaded to save context. The stub that"
    " replaced the result names its ref and its length in characters. Returns the"
    " characters from start, at most length of them."
)


def read_result_schema() -> dict[str, Any]:
    """The injected tool's input as a JSON Schema; each format wraps it in its own tool
    definition (proxy/wire/), the same bytes every time, so caching holds."""
    return {
        "type": "object",
        "properties": {
            "ref": {"type": "string", "description": "The ref named in the stub."},
            "start": {
                "type": "integer",
                "minimum": 0,
                "description": "Offset of the first character to read.",
            },
            "length": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_READ_CHARS,
                "description": "How many characters to read.",
            },
        },
        "required": ["ref"],
    }


def content_text(content: object) -> str | None:
    """The text of a tool result's content (a string, or a list of text parts), or None
    if it holds anything but text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        return None
    parts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text":
            return None  # images, documents: not ours to cut
        parts.append(str(part.get("text", "")))
    return "\n".join(parts)


def result_text(block: Mapping[str, Any]) -> str | None:
    """The text of a mapping's `content` (a tool_result block, a ToolResult's fields)."""
    return content_text(block.get("content"))


def ref_for(text: str) -> str:
    return "r_" + hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


_REF = re.compile(r"\br_[0-9a-f]{16}\b")


def refs_in(text: str) -> list[str]:
    """The refs a text names (a summary may name those of results it folded)."""
    return list(dict.fromkeys(_REF.findall(text)))


def stub_text(text: str, ref: str, tool: str, head_chars: int, read_length: int) -> str:
    """The result's head, then what it was and how to read on, in as few tokens as say
    it (about 44 with the ref; bench/RESULTS.md, issue 35): its size, its ref, and the
    call that reads from where the head ends. The call that made it (the tool and its
    arguments) is not repeated: it stays whole in the message just before, in every
    format, as long as the stub does (a fold takes both)."""
    head = _head(text, head_chars)
    shown = len(head)
    length = min(read_length, MAX_READ_CHARS)
    return (
        f"{head}\n[compaction-proxy offloaded this result: {len(text):,} characters;"
        f' {tool}(ref="{ref}", start={shown}, length={length}) reads on]'
    )


def names_tool(text: str, tool: str) -> bool:
    """Whether a result's text is a stub `stub_text` wrote for this read_result tool."""
    return text.endswith(" reads on]") and f'; {tool}(ref="r_' in text[-160:]


def _head(text: str, limit: int) -> str:
    """The first `limit` characters, cut at a line end when one is near the limit."""
    if len(text) <= limit:
        return text
    cut = text.rfind("\n", int(limit * 0.8), limit)
    return text[: cut if cut > 0 else limit]


@dataclass(frozen=True, slots=True)
class Stub:
    """One stub in a message: the tool result it replaces (`block`, its index among the
    message's results as the dialect's `tool_results` numbers them), its ref, and how
    much of the result's head stays. A checkpoint's `Stubbed` segment keeps them."""

    block: int
    ref: str
    head_chars: int


@dataclass(frozen=True, slots=True)
class ToolResult:
    """One tool result a message gives, in no API's shape: where it is (`block`, as in
    Stub), the call it answers, and its content, a string or a list of parts in the
    shared block counter's terms (text parts `{"type": "text", "text": ...}`)."""

    block: int
    call_id: str | None
    content: object
    # Its text (`content_text` of its content, made once by the format that reads it),
    # or None when it holds anything but text (then it is never stubbed).
    text: str | None


@dataclass(frozen=True, slots=True)
class ReadRequest:
    ref: str
    start: int
    length: int


def parse_read_args(arguments: object, default_length: int) -> ReadRequest | str:
    """A read_result call's input, checked; a string is the error to give the model."""
    if not isinstance(arguments, dict):
        return "read_result needs an object with ref, start and length."
    ref = arguments.get("ref")
    start = arguments.get("start", 0)
    length = arguments.get("length", default_length)
    if not isinstance(ref, str) or not ref:
        return "read_result needs the ref named in the stub, as a string."
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        return "start must be a whole number of characters, 0 or more."
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        return "length must be a whole number of characters, 1 or more."
    return ReadRequest(ref, start, min(length, MAX_READ_CHARS))


def read_slice(text: str, request: ReadRequest, *, cut: bool = False) -> str:
    """The slice the model asked for, framed so it knows where it is in the whole.
    `cut`: the slice is shorter than asked, to keep the request inside the window."""
    total = len(text)
    if request.start >= total:
        return f"start {request.start:,} is past the end: the result has {total:,} characters."
    end = min(total, request.start + request.length)
    why = " Shortened to fit the context window." if cut and end < total else ""
    more = f" Call again with start={end} for more." if end < total else " That is the end."
    frame = f"[characters {request.start:,} to {end:,} of {total:,}.{why}{more}]"
    return f"{frame}\n{text[request.start : end]}"


# What the client's message ends with when the proxy stops the read_result rounds while
# the model still wanted to read: the agent sees why, and that it can ask to go on.
STOP_NOTES = {
    "limit": (
        "[compaction-proxy: still reading offloaded tool results when the limit of {rounds}"
        " read rounds per request was reached; ask to continue if more is needed.]"
    ),
    "window": (
        "[compaction-proxy: what was asked of the offloaded tool results does not fit the"
        " context window; ask for a smaller part.]"
    ),
    "budget": (
        "[compaction-proxy: reading offloaded tool results was stopped by this key's token budget.]"
    ),
}


def unknown_ref(ref: str) -> str:
    # The same words for "missing" and "not yours" (docs/design.md#tenants-are-isolated).
    return f"No offloaded result {ref!r} is available in this conversation."
