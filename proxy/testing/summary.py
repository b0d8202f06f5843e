"""The stand-in's answer to a summarisation request: deterministic, and keeps identifiers.

A real summariser is a model; the stand-in's only duty is to behave like a good one in the
ways the proxy's tests can check: the same request gives the same summary, identifiers
(paths, numbers, CamelCase and snake_case names, ids) from the folded conversation appear
verbatim, and the answer stays within `max_tokens` as counted by the project's counter.

The text read is that of the messages (text blocks, tool calls' inputs, tool results),
not the system prompt, which holds the summariser's instruction. Like a real model asked
what the user is "currently trying to do", it notes the newest message it was shown
first (in place, the whole history is shown: the newest turn too, not only the messages
the notes replace).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from proxy.core.tokens import TokenCounter

IDENTIFIER = re.compile(
    r"""
      (?:[\w.-]+)?(?:/[\w.-]+)+           # paths: src/app.py, /etc/hosts
    | \b[\w-]+\.[A-Za-z][\w]{0,7}\b      # file names: app.py, README.md
    | \b[A-Za-z]+_[0-9A-Za-z_]+\b        # snake_case and ids: toolu_01ab, r_00ff, max_tokens
    | \b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b  # CamelCase
    | \b[a-z]+[A-Z][A-Za-z0-9]*\b        # camelCase
    | \b[0-9a-f]{8,}\b                   # hashes
    | \b\d+(?:\.\d+)*\b                  # numbers and versions
    """,
    re.VERBOSE,
)
NOTE_CHARS = 200


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            out.append(block["text"])
        elif kind == "tool_use":
            call = orjson.dumps(block.get("input")).decode()
            out.append(f"called {block.get('name')} ({block.get('id')}) with {call}")
        elif kind == "tool_result":
            out.extend(_texts(block.get("content")))
    return out


def identifiers(text: str) -> list[str]:
    """Identifiers in order of first appearance, each once."""
    seen: dict[str, None] = {}
    for match in IDENTIFIER.finditer(text):
        seen.setdefault(match.group(0).strip(), None)
    return [s for s in seen if s]


def summarise(body: dict[str, Any], counter: TokenCounter, loss: int = 0) -> str:
    """A summary of the request's messages, at most max_tokens tokens long. `loss` > 0
    plays a lossy model: every `loss`-th identifier it finds is left out, notes included
    (5: a fifth of them)."""
    notes: list[str] = []
    found: dict[str, None] = {}
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    for message in messages:
        text = " ".join(" ".join(_texts(message.get("content"))).split())
        if not text:
            continue
        for name in identifiers(text):
            found.setdefault(name, None)
        head = text if len(text) <= NOTE_CHARS else text[:NOTE_CHARS].rstrip() + " ..."
        notes.append(f"- {message.get('role')}: {head}")
    names = list(found)
    if loss > 0:
        lost = set(names[loss - 1 :: loss])
        names = [n for n in names if n not in lost]
        notes = [_without(note, lost) for note in notes]

    budget = int(body.get("max_tokens") or 1024)
    lines = [f"Summary of {len(messages)} earlier messages."]
    current = _currently(messages)
    if current:
        # What a real model notes first: what the user is currently doing, from the
        # newest message it was shown (in place, the one before the proxy's prompt).
        lines.append(f"Currently: {current}")
    if names:
        lines.append("Identifiers: " + ", ".join(names))
    lines.append("Notes:")
    lines.extend(notes)
    return _fit(lines, budget, counter)


def _currently(messages: list[dict[str, Any]]) -> str:
    """The tail of the newest user message the summariser was shown, other than the
    proxy's own request for notes (the last message of a summary made in place)."""
    users = [m for m in messages if m.get("role") == "user"]
    if users and " ".join(_texts(users[-1].get("content"))).startswith("[compaction-proxy]"):
        users = users[:-1]
    if not users:
        return ""
    text = " ".join(" ".join(_texts(users[-1].get("content"))).split())
    return text if len(text) <= NOTE_CHARS else "... " + text[-NOTE_CHARS:].lstrip()


def _without(text: str, lost: set[str]) -> str:
    """The text with every lost identifier (and anything that contains one) removed."""
    return IDENTIFIER.sub(lambda m: "" if _contains_lost(m.group(0), lost) else m.group(0), text)


def _contains_lost(found: str, lost: set[str]) -> bool:
    return any(name in found for name in lost)


def _fit(lines: list[str], budget: int, counter: TokenCounter) -> str:
    """The longest run of whole lines (then words of the last one) within budget."""
    kept: list[str] = []
    for line in lines:
        candidate = "\n".join([*kept, line])
        if counter.count_text(candidate) <= budget:
            kept.append(line)
            continue
        words = line.split(" ")
        while words and counter.count_text("\n".join([*kept, " ".join(words)])) > budget:
            words = words[: len(words) * 3 // 4] if len(words) > 4 else words[:-1]
        if words:
            kept.append(" ".join(words))
        break
    return "\n".join(kept) or "Summary."
