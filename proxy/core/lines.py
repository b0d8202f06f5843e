"""Lines of a conversation: its checkpoints, several at once
(docs/design.md#lines-of-a-conversation).

A *conversation* is what one agent session sends (its id, proxy/core/identity.py); a
*line* is one path through it. A rewind (an earlier message edited), a fork, a retry
with other text, or sub-agents sharing a session id and a first message make several
lines. Every line keeps its own checkpoint, keyed by the exact prefix it rewrote (the
chained digest of the client messages it covers), so the lines never overwrite each
other:

- a request takes the checkpoint with the longest prefix its history begins with (a
  line's newest, or an ancestor of it for a request rewound past the newest crossing);
- a crossing adds its checkpoint under its own prefix; the one it grew from stays (a
  rewind may still need it) until it is the least recently used of more than
  `max_lines` and goes;
- "used" is a logical clock: one more than the highest in the set, given when a line
  is made and when a request takes a line that was not the most recent one (so a single
  line never pays a write for it).

Summaries made ahead are kept the same way, one note per history they were made from
(`PreparedSummary.seen`): a note is used only by a request whose history begins with
exactly what its summariser call saw, and at most `max_lines` notes are kept.
Pure functions over plain data; the store keeps each line in one field of one hash per
first message (proxy/store/redis.py), so a load stays one round trip.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from proxy.core.checkpoint import Checkpoint, Line
from proxy.core.commands import PreparedSummary
from proxy.core.digests import chain_hash
from proxy.core.segments import vouched_refs

__all__ = [
    "Line", "begins_with", "best_line", "best_note", "evicted", "evicted_notes", "next_tick",
]  # fmt: skip

DEFAULT_MAX_LINES = 4  # checkpoints kept per conversation (per first message)

# Field names in the conversation's hash of lines.
CHECKPOINT_FIELD = "c:"
USED_FIELD = "u:"
NOTE_FIELD = "p:"


def begins_with(digests: Sequence[bytes], covers: int, prefix_hash: str) -> bool:
    """Whether a history begins with what a line's checkpoint or a note was made from:
    its first `covers` messages, whose match digests chain to `prefix_hash`."""
    return 0 < covers <= len(digests) and chain_hash(digests[:covers]) == prefix_hash


def best_line(lines: Iterable[Line], digests: Sequence[bytes]) -> Line | None:
    """The line whose checkpoint covers the longest prefix of this history."""
    best: Line | None = None
    for line in lines:
        checkpoint = line.checkpoint
        if not begins_with(digests, checkpoint.covers, checkpoint.prefix_hash):
            continue
        if best is None or (line.checkpoint.covers, line.used) > (
            best.checkpoint.covers,
            best.used,
        ):
            best = line
    return best


def best_note(notes: Iterable[PreparedSummary], digests: Sequence[bytes]) -> PreparedSummary | None:
    """The summary made ahead from the longest prefix of this history (None: none was
    made from what this history begins with)."""
    best: PreparedSummary | None = None
    for note in notes:
        applies = begins_with(digests, note.covers, note.seen)
        if applies and (best is None or note.covers > best.covers):
            best = note
    return best


def next_tick(lines: Iterable[Line]) -> int:
    return 1 + max((line.used for line in lines), default=0)


def renewal(
    before: Checkpoint | None, made: Checkpoint, kept: Sequence[str], now: int, every: int
) -> tuple[Checkpoint, tuple[str, ...]]:
    """The checkpoint a crossing saves on its line and the refs whose TTLs to renew, at
    the shell's clock `now` (seconds) renewing them at most `every` seconds (0 for either:
    at every crossing). Incremental offload makes nearly every turn a crossing, and
    renewing every ref a long conversation names at each of them is work that grows with
    the conversation: refs the line's previous checkpoint (`before`) named were renewed
    (or written) at its `renewed_at` or later, so within `every` of that they are left
    alone (an eviction among them is then found at the next renewal)."""
    if now <= 0 or every <= 0:
        return made, tuple(kept)
    if before is None:
        return replace(made, renewed_at=now), tuple(kept)
    last = before.renewed_at
    if 0 < last <= now < last + every and set(kept) <= set(vouched_refs(before.segments)):
        return replace(made, renewed_at=last), ()
    return replace(made, renewed_at=now), tuple(kept)


def is_most_recent(line: Line, lines: Sequence[Line]) -> bool:
    return all(other.used <= line.used for other in lines)


def evicted(lines: Sequence[Line], new: str, max_lines: int) -> tuple[str, ...]:
    """The lines to drop so that, with the line `new` added, at most `max_lines` remain:
    the least recently used first, never `new` itself."""
    kept = {line.name for line in lines} | {new}
    over = len(kept) - max(1, max_lines)
    if over <= 0:
        return ()
    oldest = sorted((line for line in lines if line.name != new), key=lambda other: other.used)
    return tuple(line.name for line in oldest[:over])


def evicted_notes(
    notes: Sequence[PreparedSummary], max_lines: int, adding: str = ""
) -> tuple[str, ...]:
    """The notes of summaries made ahead to drop (the oldest made first) so that, with
    `adding` written, at most `max_lines` remain."""
    names = {note.seen for note in notes} | ({adding} if adding else set())
    over = len(names) - max(1, max_lines)
    if over <= 0:
        return ()
    oldest = sorted((n for n in notes if n.seen != adding), key=lambda n: n.made)
    return tuple(note.seen for note in oldest[:over])
