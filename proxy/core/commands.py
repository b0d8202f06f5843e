"""The effects the compaction driver and the read rounds ask for, and their replies.

The driver (proxy/core/driver.py) and the read rounds (proxy/core/rounds.py) are
generators: each yields one command at a time and is resumed with the reply. An executor
carries the commands out: on Redis and the upstream in the server (the driver's in
proxy/server/executor.py, the rounds' `RoundExecutor` in proxy/server/read_rounds.py), on
dicts in the ops simulator (proxy/ops/simulate.py).
Commands are plain data, so tests can assert the exact sequence a request produces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.core.checkpoint import Checkpoint, Line
from proxy.core.facts import Facts, keep_facts
from proxy.core.wire_format import Round


@dataclass(frozen=True, slots=True)
class LoadConversation:
    """Read the conversation's state for one checkpoint root (one round trip): every
    line's checkpoint and every note of a summary made ahead (proxy/core/lines.py)."""

    root: str


@dataclass(frozen=True, slots=True)
class PreparedSummary:
    """A summary made ahead, in the background: where it is stored (`key`), the key of
    the turns it folds (`folds`), what its summariser call saw (the first `covers` client
    messages, whose chained digest is `seen`: only a history that begins with exactly
    those may use it), and its text once it is ready (None while it is being made, or
    when the summariser failed: then the crossing makes it itself)."""

    key: str
    text: str | None = None
    failed: bool = False
    folds: str = ""
    covers: int = 0
    seen: str = ""
    made: int = 0  # logical clock of the line it was made for (the oldest go first)

    @property
    def pending(self) -> bool:
        return self.text is None and not self.failed


@dataclass(frozen=True, slots=True)
class Loaded:
    """A conversation's stored state. `lines` and `notes`: every line's checkpoint and
    every summary made ahead (the driver picks those this history begins with);
    `checkpoint` and `prepared`: one of each, counted in with them (a store of a single
    line, as tests and tools build it)."""

    checkpoint: Checkpoint | None = None
    store_ok: bool = True  # False: the store could not be read; plan without it
    prepared: PreparedSummary | None = None
    lines: tuple[Line, ...] = ()
    notes: tuple[PreparedSummary, ...] = ()


@dataclass(frozen=True, slots=True)
class GetSummary:
    """A summary of the folded turns: the stored one for `key`, else made (once for the
    fleet; whoever makes it holds the key's lock until the crossing's SaveCrossing stores
    it). `body` is the summariser's request, in the conversation's API (made in place,
    reading the conversation's cached prefix, when the summariser is its model); `summary_tokens`
    is its output cap in tokens. `ahead`: it is the summary being made ahead, in the
    background: wait for that call (however long it takes), never give up on it early.
    `encoded`: an in-place `body` as the bytes to send (what it keeps of the conversation's
    request as the client's bytes; empty: `body` serialised). `fallback`: the transcript
    request to send when the in-place `body` is answered with a tool call instead of notes
    (the tools it carries for the cache's sake tempt the model). `relist`: below.
    `facts`: the folded turns' identifiers the made summary must keep, within
    `facts_budget` tokens: `finished` is the one place they are applied, by every
    executor, to the text its summariser made (a stored summary has them already)."""

    key: str
    body: dict[str, Any]
    summary_tokens: int
    model: str
    ahead: bool = False
    fallback: dict[str, Any] | None = None
    facts: Facts = field(default_factory=Facts)
    facts_budget: int = 0
    encoded: bytes = b""
    # read_result's name where the in-place `body` carries it deferred by the proxy's
    # choice (as the conversation's request does): should the upstream refuse `body` with
    # a 400, it goes once more with it listed (Request.listed), as that request would.
    relist: str | None = None

    def finished(
        self, text: str, count: Callable[[str], int], ranked: Sequence[str] | None = None
    ) -> str:
        """The summariser's text as stored and folded: with the identifiers of `facts`
        it left out appended (proxy/core/facts.py). `ranked`: the facts ranked already
        (the server ranks them off its event loop)."""
        if self.facts_budget <= 0 or not self.facts.sources:
            return text
        order = self.facts.ranked() if ranked is None else ranked
        return keep_facts(text, order, self.facts_budget, count)


@dataclass(frozen=True, slots=True)
class SummaryReply:
    text: str | None  # None: no summary to be had
    reused: bool = False  # it was stored already (no summariser call)
    waited: bool = False  # ... by a summary made ahead that this request waited for
    failure: str = ""  # why there is none
    # ... the store could not be read for it (it may be stored): what the crossing does
    # instead is planned as without the store, and stores nothing
    unread: bool = False


@dataclass(frozen=True, slots=True)
class SaveCrossing:
    """Everything a crossing writes, at once: the blobs it offloaded, the summary it made,
    its checkpoint (a line of its own, under its prefix, `used` its logical clock), fresh
    TTLs for every ref stored earlier that it still names, and the lines and notes of
    summaries made ahead it evicts (the least recently used beyond the bound)."""

    root: str
    checkpoint: Checkpoint | None  # None: only blobs (ones found gone, written again)
    blobs: tuple[tuple[str, str], ...]  # (ref, text)
    touch: tuple[str, ...]  # refs stored earlier that the new checkpoint still names
    summary: tuple[str, str] | None = None  # (key, text) of a summary made for it
    used: int = 0
    evict: tuple[str, ...] = ()  # lines (their prefix hashes) to drop
    evict_notes: tuple[str, ...] = ()  # notes of summaries made ahead (their `seen`)


@dataclass(frozen=True, slots=True)
class TouchLine:
    """Mark a line most recently used (a request took a line that was not the most
    recent one). Fire and forget, off the request: the reply is `Started`."""

    root: str
    line: str
    used: int


@dataclass(frozen=True, slots=True)
class PrepareSummary:
    """Make, in the background, the summary the next fold will want (so no agent turn
    waits for it): store it under `ask.key`, finished with its facts (`ask.finished`),
    and keep `note` for it (what it folds and what its call saw), evicting the notes of
    `evict_notes`. Fire and forget: the reply is `Started`."""

    root: str
    ask: GetSummary
    note: PreparedSummary | None = None
    evict_notes: tuple[str, ...] = ()

    @property
    def facts(self) -> Facts:
        return self.ask.facts

    @property
    def facts_budget(self) -> int:
        return self.ask.facts_budget


@dataclass(frozen=True, slots=True)
class Started:
    pass


@dataclass(frozen=True, slots=True)
class Saved:
    ok: bool  # False: some write failed; nothing may depend on what was written
    lost: tuple[str, ...] = ()  # refs to refresh whose blobs were gone (evicted, expired)


Command = LoadConversation | GetSummary | SaveCrossing | PrepareSummary | TouchLine
Reply = Loaded | SummaryReply | Saved | Started


# -- read rounds (proxy/core/rounds.py) ------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendRound:
    """Send this round upstream and relay what the client may see of its answer (the
    read_result calls held back); the reply is `Answered` with what the model asked, or
    `Failed`. Round 1 is the rewritten request itself, already sent by the route: its
    answer is the response in hand."""

    body: bytes
    number: int  # 1, 2, ...: round 1 is the request as the route sent it

    @property
    def first(self) -> bool:
        return self.number == 1


@dataclass(frozen=True, slots=True)
class Answered:
    round: Round


@dataclass(frozen=True, slots=True)
class Failed:
    """The round's answer failed (an upstream error, a broken stream): the rounds end."""

    outcome: str  # the record's read_outcome


# A Failed outcome: the upstream refused round 1 (a 400) and nothing of it reached the
# client, as a transport answers where the round has a listed form to send in its place
# (read_result deferred by the proxy's choice: proxy/core/rounds.py).
REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class ReadResults:
    """Read these offloaded results from the store (refs the history sent names), one
    read each, in order."""

    refs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Results:
    """What the store had for each ref of ReadResults: its text, or None when it is gone;
    `unavailable[i]`: the store could not be read for the i-th."""

    texts: tuple[str | None, ...]
    unavailable: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class TopUp:
    """Hold the next round in the caller's budgets: its estimated input (calibrated) and
    its output cap. The reply is `ToppedUp`."""

    tokens: int
    output: int | None


@dataclass(frozen=True, slots=True)
class ToppedUp:
    ok: bool  # False: a budget refused it; the round is not sent


RoundCommand = SendRound | ReadResults | TopUp
RoundReply = Answered | Failed | Results | ToppedUp
