"""The effects the compaction driver asks for, and the replies it expects.

The driver (proxy/core/driver.py) is a generator: it yields one command at a time and is
resumed with the reply. An executor carries the commands out: on Redis and the upstream
in the server (proxy/server/executor.py), on dicts in the ops simulator
(proxy/ops/simulate.py). Commands are plain data, so tests can assert the exact sequence
a request produces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.core.checkpoint import Checkpoint
from proxy.core.facts import Facts


@dataclass(frozen=True, slots=True)
class LoadConversation:
    """Read the conversation's state for one checkpoint slot (one round trip)."""

    slot: str


@dataclass(frozen=True, slots=True)
class PreparedSummary:
    """A summary made ahead for this checkpoint slot, in the background: the key of the
    turns it folds, and its text once it is ready (None while it is being made, or when
    the summariser failed: then the crossing makes it itself)."""

    key: str
    text: str | None = None
    failed: bool = False

    @property
    def pending(self) -> bool:
        return self.text is None and not self.failed


@dataclass(frozen=True, slots=True)
class Loaded:
    checkpoint: Checkpoint | None
    store_ok: bool = True  # False: the store could not be read; plan without it
    prepared: PreparedSummary | None = None


@dataclass(frozen=True, slots=True)
class GetSummary:
    """A summary of the folded turns: the stored one for `key`, else made (once for the
    fleet; whoever makes it holds the key's lock until the crossing's SaveCrossing stores
    it). `body` is the summariser's request, in the conversation's API (made in place,
    reading the conversation's cached prefix, when the summariser is its model); `slot`
    is its output cap in tokens. `ahead`: it is the summary being made ahead, in the
    background: wait for that call (however long it takes), never give up on it early.
    `fallback`: the transcript request to send when the in-place `body` is answered with a
    tool call instead of notes (the tools it carries for the cache's sake tempt the model)."""

    key: str
    body: dict[str, Any]
    slot: int
    model: str
    ahead: bool = False
    fallback: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class SummaryReply:
    text: str | None  # None: no summary to be had
    reused: bool = False  # it was stored already (no summariser call)
    waited: bool = False  # ... by a summary made ahead that this request waited for
    failure: str = ""  # why there is none


@dataclass(frozen=True, slots=True)
class SaveCrossing:
    """Everything a crossing writes, at once: the blobs it offloaded, the summary it made,
    its checkpoint, and fresh TTLs for every ref stored earlier that it still names."""

    slot: str
    checkpoint: Checkpoint | None  # None: only blobs (ones found gone, written again)
    blobs: tuple[tuple[str, str], ...]  # (ref, text)
    touch: tuple[str, ...]  # refs stored earlier that the new checkpoint still names
    summary: tuple[str, str] | None = None  # (key, text) of a summary made for it


@dataclass(frozen=True, slots=True)
class PrepareSummary:
    """Make, in the background, the summary the next fold will want (so no agent turn
    waits for it): store it under `key`, checked for `facts` within `facts_budget`, and
    note it as this slot's prepared summary. Fire and forget: the reply is `Started`."""

    slot: str
    ask: GetSummary
    facts: Facts
    facts_budget: int


@dataclass(frozen=True, slots=True)
class Started:
    pass


@dataclass(frozen=True, slots=True)
class Saved:
    ok: bool  # False: some write failed; nothing may depend on what was written
    lost: tuple[str, ...] = ()  # refs to refresh whose blobs were gone (evicted, expired)


Command = LoadConversation | GetSummary | SaveCrossing | PrepareSummary
Reply = Loaded | SummaryReply | Saved | Started
