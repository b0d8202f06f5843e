"""What planning a request answers (docs/design.md#over-the-thresholds), as types the
shell matches on.

- `Untouched`: the history fits and no checkpoint applies: forward the original bytes;
- `Rewrite`: the messages to send, the blobs to store and the new checkpoint;
- `Refuse`: nothing fits; the message says what and by how much;
- `FoldPlan`: a crossing that wants a summary of the oldest groups first (never the
  end of a request: `rewrites.fold` completes it into a Rewrite or a Refuse);
- `Recount`: estimated counts that cannot decide: counted exactly, planned again.

`Outcome` is how a request ends (the driver's `Decision` carries it to the shell);
`Planned` is what `planner.plan` answers. Every outcome that differs from what the policy
aimed at carries a `reason` (a fixed word, see REASONS) so the client and the operator
can tell why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.core.checkpoint import Checkpoint
from proxy.core.facts import Facts
from proxy.core.strategy import Strategy
from proxy.core.working import Limits, PlanInput, Working

# How a crossing had its summary (header x-compaction-summary; "" when it has none).
SUMMARY_STATES = {
    "made": "made for this request by a summariser call it waited for",
    "ahead": "made ahead, in the background, for this fold: the request did not wait",
    "waited": "made ahead, still being made at the wait point: the request waited for it",
    "reused": "already in the store (a resend, or a summary from an earlier crossing)",
}

# Why an outcome differs from what the policy aimed at (header x-compaction-reason).
REASONS = {
    "store_unavailable": "the store is unreachable: nothing can be offloaded or summarised",
    "summary_pending": "over the trigger, but the fold's summary is still being made ahead",
    "summary_unavailable": "no summary could be had (summariser failed or busy): packed",
    "no_fold": "the newest groups alone exceed the target: packed instead of folding",
    "offload_off": "the client uses both read_result names: offloading is off",
    "target_unreachable": "what cannot be dropped leaves the history above the trigger",
    "too_long": "nothing fits the window",
    "invalid_request": "the API would refuse the request: sent as it came, for its own error",
    "invalid_rewrite": "the rewrite would break the API's rules: the request is sent as it came",
    "too_deep": "the body nests values deeper than JSON is written (255 levels): sent as it came",
    "failed": "compaction failed (a fault of the proxy's, logged): the request is sent as it came",
}

# The reasons for which compaction was declined: the request went on as the client wrote
# it (or was refused as the API would), with a warning (metric compaction_declined_total).
DECLINED = frozenset({"invalid_request", "invalid_rewrite", "too_deep", "failed"})


@dataclass(frozen=True, slots=True)
class Untouched:
    tokens: int  # history, calibrated
    prepare: FoldPlan | None = None  # a fold to summarise ahead, in the background
    reason: str = ""  # a REASONS key when the policy aimed at more


@dataclass(frozen=True, slots=True)
class Refuse:
    message: str
    reason: str = "too_long"


@dataclass(frozen=True, slots=True)
class Rewrite:
    messages: list[dict[str, Any]]
    tool: str | None  # inject read_result under this name
    strategy: Strategy
    tokens_before: int  # history, calibrated
    tokens_after: int
    blobs: list[tuple[str, str]] = field(default_factory=list)  # (ref, text) to store
    checkpoint: Checkpoint | None = None  # to store; None: the stored one holds
    refs: list[str] = field(default_factory=list)  # every ref the history names
    summary: str = ""  # "made", "ahead", "waited", "reused" or "" (SUMMARY_STATES)
    estimate: int = 0  # the rewritten history in estimated tokens (for calibration)
    reason: str = ""  # a REASONS key when the outcome is not what the policy aimed at
    alone: bool = False  # planned apart from the conversation's rewrite: store nothing
    breakpoint_at: int | None = None  # the last message of the stubbed region
    # What follows breakpoint_at is the result the next request stubs: the client's own
    # breakpoints after it are dropped, so it is sent uncached (1.0 a token) rather than
    # written to the cache (1.25) never to be read whole (issue 35).
    uncached_tail: bool = False
    prepare: FoldPlan | None = None  # a fold to summarise ahead, in the background


@dataclass(frozen=True, slots=True)
class InPlace:
    """A summary asked of the conversation's own request (its prefix read from the prompt
    cache): the history as it would go now, and the prompt that ends it."""

    history: list[dict[str, Any]]
    breakpoint_at: int | None  # where the proxy's cache breakpoint goes in it
    prompt: str  # which messages to replace, and the originals of their offloaded results
    # The history, the prompt and the summary fit the window (a crossing the hysteresis
    # put off to the window's edge has no room left: its summariser gets the transcript).
    fits: bool = True
    # The name read_result goes under in the conversation's request without the fold (the
    # summariser call's tools must be the conversation's own, byte for byte, to read its
    # cache: tools come first in the prompt cache's order).
    tool: str | None = None


@dataclass(frozen=True, slots=True)
class FoldPlan:
    """A crossing that folds the oldest groups into a summary, once it has one."""

    # Where the summary lives: the hash of everything its summariser call sees (the folded
    # turns, and in place the whole history sent: `seen_key`), so it is used only by a
    # history that begins with exactly that (docs/design.md#provenance).
    key: str
    folds: str  # hash of the folded turns as the client sent them (`summary_key`)
    transcript: str  # the folded turns as the client sent them, fitted to the summariser
    in_place: InPlace  # what a summary made in the conversation's own request needs
    summary_tokens: int  # the summary's cap, in real tokens (the facts line's budget apart)
    facts: Facts  # the folded turns' identifiers, ranked when a summary is made
    facts_budget: int  # tokens the line of identifiers the summary left out may take
    model: str  # summariser model ("" = the request's)
    inp: PlanInput
    work: Working  # the history after offloading, before folding
    limits: Limits
    fold: frozenset[str]  # labels of the groups to fold
    tokens_before: int
    blobs: list[tuple[str, str]]  # offloaded at this crossing
    reason: str = ""
    ahead: bool = False  # its summary is the one being made ahead: wait for it


@dataclass(frozen=True, slots=True)
class Recount:
    """The plan cannot go on with estimated counts (proxy/core/estimate.py): a threshold
    lies within their margin, or a fold (or a summary made ahead) is to be planned. The
    driver has the messages at `indices` counted exactly and plans again."""

    indices: tuple[int, ...]


Outcome = Untouched | Refuse | Rewrite
Planned = Outcome | FoldPlan | Recount
