"""What the proxy writes into a history, as text: summaries, drop notes, and the summariser's
instructions. The messages that carry them, and a history rendered as a transcript, are
each format's own (the Dialect of proxy/core/wire_format.py)."""

from __future__ import annotations

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
ORIGINALS = (
    "\n\nThe offloaded tool results among those messages, each after its ref, whole where"
    " they fit, else their lines that name something; note each ref next to what it"
    " holds:\n\n"
)
HEAD_CHARS = 60


def in_place_prompt(first: int, last: int, heads: tuple[str, str], originals: str) -> str:
    """The last user message of a summary made in place: which messages to replace, and
    the originals of the results that were offloaded among them."""
    first_head, last_head = (" ".join(h.split())[:HEAD_CHARS] for h in heads)
    prompt = IN_PLACE.format(first=first, last=last, first_head=first_head, last_head=last_head)
    return prompt + ORIGINALS + originals if originals else prompt


def summary_text(text: str, folded: int) -> str:
    """A summary as the proxy writes it into a history: its header, then the notes (each
    format puts it in a message of its own shape: proxy/wire/)."""
    return f"{SUMMARY_HEADER.format(folded=folded)}\n{text}"


def note_text(dropped: int) -> str:
    return NOTE_TEXT.format(dropped=dropped)
