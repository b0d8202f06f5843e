"""What the compaction executor reads and writes in one Redis round trip each.

``Store.load_conversation`` answers with a ``ConversationState``; ``Store.save_crossing``
with a ``CrossingSaved`` that says which of a crossing's writes landed. The commands are
built here from plain data (key names, packed values); the Store sends them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# A crossing's write may take longer than a single small call: allow the store's own
# timeout twice, plus time for every command and every byte on a loaded machine
# (a single Redis does far better: ~100k commands/s, hundreds of MB/s on loopback).
SECONDS_PER_COMMAND = 0.002
BYTES_PER_SECOND = 5_000_000
MAX_CROSSING_SECONDS = 30.0


def crossing_timeout(op_timeout: float, commands: int, payload: int) -> float:
    """Seconds one crossing's pipelined write may take."""
    sized = 2 * op_timeout + commands * SECONDS_PER_COMMAND + payload / BYTES_PER_SECOND
    return min(MAX_CROSSING_SECONDS, max(op_timeout, sized))


@dataclass(frozen=True, slots=True)
class ConversationState:
    """A conversation's stored state for one request, read in one round trip.

    lines: every line of the request's slot: (its checkpoint, decoded JSON object; its
      logical clock), most recently used first.
    summaries: of the summary keys asked for, those stored (key -> text).
    notes: the slot's notes of summaries made ahead (decoded JSON).
    """

    lines: tuple[tuple[dict[str, Any], int], ...] = ()
    summaries: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[object, ...] = ()

    @property
    def checkpoint(self) -> dict[str, Any] | None:
        """The most recently used line's checkpoint (None: the slot has none)."""
        return self.lines[0][0] if self.lines else None


@dataclass(frozen=True, slots=True)
class CrossingSaved:
    """Which of a crossing's writes are stored.

    blobs: every blob was written (True when there were none).
    checkpoint: the checkpoint is stored, and so (at that moment) is every blob it names
      (True when there was none to store). A checkpoint whose blobs failed is not kept.
    summary: the summary is stored (True when there was none).
    lost: refs to refresh whose blobs no longer exist (evicted or expired): stubs that
      name them read as "no longer available".
    error: what went wrong, for the log's reason ("" when nothing did).
    """

    blobs: bool
    checkpoint: bool
    summary: bool
    lost: tuple[str, ...] = ()
    error: str = ""

    @property
    def complete(self) -> bool:
        return self.blobs and self.checkpoint and self.summary and not self.error


def failed(error: str, *, blobs: bool, checkpoint: bool, summary: bool) -> CrossingSaved:
    """Nothing that was to be written is known to be stored."""
    return CrossingSaved(not blobs, not checkpoint, not summary, error=error)
