"""What the proxy writes into a history: summaries, drop notes, and the summariser's input."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

SUMMARY_HEADER = "[compaction-proxy: summary of {folded} earlier messages, folded to save context]"
NOTE_TEXT = (
    "[compaction-proxy: {dropped} earlier messages were dropped to fit the context window;"
    " they are no longer available. Ask the user if something from them is needed.]"
)

INSTRUCTION = """You compact the early part of a conversation between a user and an AI agent \
that uses tools. The agent will continue the conversation from your notes alone: it cannot \
see the original messages. Write notes, not prose. Record:
- the user's goal and what they are currently trying to do;
- decisions made and constraints agreed, verbatim where the wording matters;
- facts established, keeping every identifier verbatim: file paths, function and variable \
names, commands, URLs, ids, error messages, numbers and versions;
- what was tried and failed, and why, so it is not tried again;
- refs of offloaded tool results (like r_0123abcd...) next to what they hold, since the \
agent can still read them with read_result.
Leave out pleasantries, restated questions and anything later superseded. If the \
conversation already starts with an earlier summary, carry its facts forward."""


IN_PLACE = """[compaction-proxy] This conversation is getting long. Write notes that will \
replace messages {first} to {last} above (counted from the first message as 1: from the one \
that begins "{first_head}" to the one that begins "{last_head}"). The agent will continue \
from your notes and the later messages: it will not see those messages again. Record:
- the user's goal and what they are currently trying to do;
- decisions made and constraints agreed, verbatim where the wording matters;
- facts established, keeping every identifier verbatim: file paths, function and variable \
names, commands, URLs, ids, error messages, numbers and versions;
- what was tried and failed, and why, so it is not tried again;
- refs of offloaded tool results (like r_0123abcd...) next to what they hold, since the \
agent can still read them with read_result.
Leave out pleasantries and anything later superseded; carry forward the facts of an earlier \
summary among those messages. Answer with the notes only, as plain text: call no tool."""
ORIGINALS = "\n\nThe offloaded tool results among those messages, in full where they fit:\n\n"
HEAD_CHARS = 60


def in_place_prompt(first: int, last: int, heads: tuple[str, str], originals: str) -> str:
    """The last user message of a summary made in place: which messages to replace, and
    the originals of the results that were offloaded among them."""
    first_head, last_head = (" ".join(h.split())[:HEAD_CHARS] for h in heads)
    prompt = IN_PLACE.format(first=first, last=last, first_head=first_head, last_head=last_head)
    return prompt + ORIGINALS + originals if originals else prompt


def summary_message(text: str, folded: int) -> dict[str, Any]:
    header = SUMMARY_HEADER.format(folded=folded)
    return {"role": "user", "content": [{"type": "text", "text": f"{header}\n{text}"}]}


def note_text(dropped: int) -> str:
    return NOTE_TEXT.format(dropped=dropped)


def note_message(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def render_transcript(messages: Sequence[Mapping[str, Any]]) -> str:
    """The folded messages as plain text for the summariser (thinking left out)."""
    parts = []
    for message in messages:
        role = str(message.get("role", "?"))
        content = message.get("content")
        lines = [content] if isinstance(content, str) else _block_lines(content)
        body = "\n".join(line for line in lines if line)
        if body:
            parts.append(f"## {role}\n{body}")
    return "\n\n".join(parts)


def _block_lines(content: object) -> list[str]:
    if not isinstance(content, list):
        return []
    lines = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            lines.append(str(block.get("text", "")))
        elif kind == "tool_use":
            arguments = orjson.dumps(block.get("input", {})).decode()
            lines.append(f"[tool call {block.get('name')} id={block.get('id')}] {arguments}")
        elif kind == "tool_result":
            error = " (error)" if block.get("is_error") else ""
            inner = block.get("content")
            text = inner if isinstance(inner, str) else "\n".join(_block_lines(inner))
            lines.append(f"[tool result id={block.get('tool_use_id')}{error}]\n{text}")
        elif kind in ("thinking", "redacted_thinking"):
            continue  # the agent's private reasoning: not facts of the conversation
        else:
            lines.append(f"[{kind}]")
    return lines
