"""The stand-in's answer to a summarisation request: deterministic, and keeps identifiers.

A real summariser is a model; the stand-in's only duty is to behave like a good one in the
ways the proxy's tests can check: the same request gives the same summary, identifiers
(paths, numbers, CamelCase and snake_case names, ids) from the folded conversation appear
verbatim, and the answer stays within `max_tokens` as counted by the project's counter.

The text read is that of the prompt's entries (texts, tool calls' inputs, tool results),
whatever the API (prompt.py), not the system prompt, which holds the summariser's
instruction. Like a real model asked
what the user is "currently trying to do", it notes the newest message it was shown
first (in place, the whole history is shown: the newest turn too, not only the messages
the notes replace).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import orjson

from proxy.core.tokens import TokenCounter
from proxy.testing.prompt import Entry, Text
from proxy.testing.reply import Call

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


def _said(entry: Entry) -> str:
    """The entry as one line of text: its texts, calls and results in order."""
    out: list[str] = []
    for part in entry.parts:
        if isinstance(part, Text):
            out.append(part.text)
        elif isinstance(part, Call):
            given = part.input if isinstance(part.input, str) else orjson.dumps(part.input)
            arguments = given if isinstance(given, str) else given.decode()
            out.append(f"called {part.name} ({part.id}) with {arguments}")
        else:
            out.extend(part.texts)
    return " ".join(" ".join(out).split())


def identifiers(text: str) -> list[str]:
    """Identifiers in order of first appearance, each once."""
    seen: dict[str, None] = {}
    for match in IDENTIFIER.finditer(text):
        seen.setdefault(match.group(0).strip(), None)
    return [s for s in seen if s]


def summarise(
    entries: Sequence[Entry],
    budget: int,
    counter: TokenCounter,
    loss: int = 0,
    keeps: Sequence[str] = (),
) -> str:
    """A summary of the entries, at most `budget` tokens long. `loss` > 0 plays a lossy
    model: every `loss`-th identifier it finds is left out, notes included (5: a fifth of
    them). `keeps`: strings noted first whenever an entry shows one whole (an attentive
    model keeps what matters and cannot keep what it was not shown)."""
    notes: list[str] = []
    found: dict[str, None] = {}
    shown: list[str] = []
    for entry in entries:
        text = _said(entry)
        shown.append(text)
        if not text:
            continue
        for name in identifiers(text):
            found.setdefault(name, None)
        head = text if len(text) <= NOTE_CHARS else text[:NOTE_CHARS].rstrip() + " ..."
        notes.append(f"- {entry.role}: {head}")
    names = list(found)
    if loss > 0:
        lost = set(names[loss - 1 :: loss])
        names = [n for n in names if n not in lost]
        notes = [_without(note, lost) for note in notes]

    lines = [f"Summary of {len(entries)} earlier messages."]
    seen = "\n".join(shown)
    kept = [keep for keep in keeps if keep in seen]
    if kept:
        lines.append("Kept: " + "; ".join(kept))
    current = _currently(entries)
    if current:
        # What a real model notes first: what the user is currently doing, from the
        # newest message it was shown (in place, the one before the proxy's prompt).
        lines.append(f"Currently: {current}")
    if names:
        lines.append("Identifiers: " + ", ".join(names))
    lines.append("Notes:")
    lines.extend(notes)
    return _fit(lines, budget, counter)


def _currently(entries: Sequence[Entry]) -> str:
    """The tail of the newest user message the summariser was shown, other than the
    proxy's own request for notes (the last message of a summary made in place)."""
    users = [e for e in entries if e.role == "user"]
    if users and _said(users[-1]).startswith("[compaction-proxy]"):
        users = users[:-1]
    if not users:
        return ""
    text = _said(users[-1])
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
