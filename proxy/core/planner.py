"""The rewrite planner: what to do with one request's history (DESIGN section 5).

`plan` is a pure function of the request's messages, the conversation's checkpoint and
the policy. It answers with one of:

- `Untouched`: the history fits and no checkpoint applies: forward the original bytes;
- `Rewrite`: the messages to send, the blobs to store and the new checkpoint;
- `FoldPlan`: a crossing that wants a summary of the oldest groups; `fold` completes it
  with the summary text (None when there is none: it packs instead);
- `Refuse`: nothing fits; the message says what and by how much.

Counts are local estimates; the policy's numbers are real tokens, so they are divided by
the calibration factor (real / estimated) once, and all the planning below happens in
estimated units.

Every outcome that differs from what the policy aimed at carries a `reason` (a fixed
word, see REASONS) so the client and the operator can tell why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.core.checkpoint import (
    Checkpoint,
    chain_hash,
    make_checkpoint,
    message_digest,
    segments_for,
)
from proxy.core.commands import PreparedSummary
from proxy.core.facts import CONVERSATION, EARLIER_SUMMARY, TOOL_RESULT, Facts, Source
from proxy.core.fold import plan_compaction
from proxy.core.history import (
    Group,
    GroupKind,
    Shape,
    compaction_turns,
    group_history,
    pack_messages,
    pinned_tokens,
)
from proxy.core.offload import Stub, ref_for, refs_in, result_text
from proxy.core.pack import pack_context
from proxy.core.policy import Policy, prepare_at
from proxy.core.segments import (
    REBUILDABLE_FORMS,
    Note,
    Segment,
    Stubbed,
    StubbedMemo,
    Summary,
    Verbatim,
    made_here,
    material,
    refs_of,
    stands_for,
    stubbed_key,
    vouched_refs,
)
from proxy.core.summary import INSTRUCTION, in_place_prompt, note_text
from proxy.core.wire_format import Dialect, MessageCounter

Message = Mapping[str, Any]

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
}


@dataclass(frozen=True, slots=True)
class PlanInput:
    messages: Sequence[Message]
    counts: Sequence[int]  # each message, estimated
    digests: Sequence[bytes]  # each message's match digest
    checkpoint: Checkpoint | None
    policy: Policy
    counter: MessageCounter
    dialect: Dialect
    fixed_tokens: int  # system prompt + tools, estimated
    tool_tokens: int  # the read_result definition, estimated
    tool: str | None  # the name read_result goes by; None = offload is off
    factor: float = 1.0  # calibration: real tokens / estimated tokens
    store_ok: bool = True  # blobs and summaries can be stored
    offload_ok: bool = True  # results may be offloaded (False: their blobs could not be kept)
    sticky_tool: bool = False  # the conversation offers read_result already: keep offering it
    prepared: PreparedSummary | None = None  # a summary made ahead for this slot
    forms: bytes = b""  # each message's digest form (Counted.forms); b"": nothing reused
    stubbed: StubbedMemo | None = None  # stubbed messages built by earlier requests


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
    strategy: str
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
    prepare: FoldPlan | None = None  # a fold to summarise ahead, in the background


@dataclass(frozen=True, slots=True)
class Working:
    """A history under construction: segments and the messages they stand for."""

    segments: list[Segment]
    messages: list[dict[str, Any]]
    shapes: list[Shape]
    groups: list[Group]
    tokens: int = field(init=False)  # of all shapes: the planner asks for it often

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", sum(s.tokens for s in self.shapes))


@dataclass(frozen=True, slots=True)
class Limits:
    limit: int  # the most history the window allows, estimated
    offload_at: int  # from here on, results leaving the keep window are offloaded
    trigger: int  # over this, the oldest turns are folded
    target: int  # ... down to this
    note: int
    window: int = 0  # the whole window, estimated (0: unknown, the deferral is the limit's)

    @property
    def prepare_at(self) -> int:
        """From here on, the next fold's summary is made ahead, in the background."""
        return prepare_at(self.trigger, self.target)

    @property
    def defer_at(self) -> int:
        """Over the trigger but under this, a fold whose summary is not ready yet waits
        for it (the request goes on unfolded); over this, the request waits for it. The
        deferral is bounded by DEFER_SHARE of the window: every turn past the trigger is
        paid at the larger size, so the fold must land at the trigger, not near the
        window's edge."""
        room = (self.limit - self.trigger) // 4
        if self.window:
            room = min(room, math.floor(self.window * DEFER_SHARE))
        return self.trigger + max(room, 0)


# How far past the trigger a fold may wait for its summary made ahead, as a share of the
# window (a turn or two of a chat-heavy session in a 200,000-token window).
DEFER_SHARE = 0.05


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
    # history that begins with exactly that (DESIGN invariant 11).
    key: str
    folds: str  # hash of the folded turns as the client sent them (`summary_key`)
    transcript: str  # the folded turns as the client sent them, fitted to the summariser
    in_place: InPlace  # what a summary made in the conversation's own request needs
    slot: int  # the summary's cap, in real tokens (the facts line's budget apart)
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


Outcome = Untouched | Rewrite | Refuse | FoldPlan


def plan(inp: PlanInput) -> Outcome:
    segments, applied = segments_for(inp.checkpoint, inp.digests)
    stored = inp.checkpoint if applied else None
    if stored is not None and stored.tool and inp.tool is None:
        # This request cannot take the conversation's rewrite (it cannot offer
        # read_result: several choices, say): plan it on its own and store nothing.
        return _alone(inp)
    if stored is not None and stored.tool and stored.tool != inp.tool:
        segments, stored = segments_for(None, inp.digests)[0], None  # the client took the name
    inp = replace(inp, sticky_tool=bool(stored is not None and stored.tool))
    work = working(segments, inp)
    limits = limits_of(inp)
    # What the client sent, not what an earlier rewrite made of it.
    before = real(sum(inp.counts), inp.factor)
    blobs: list[tuple[str, str]] = []
    if inp.tool and inp.store_ok and inp.offload_ok and work.tokens > limits.offload_at:
        # An offload step: every large result that has left the keep window becomes a
        # stub, added after what is frozen (stubs already sent never change).
        work, blobs = _offload(work, inp)
    if work.tokens <= _recross_at(limits, stored):
        quiet: Outcome
        if blobs:
            quiet = _rewrite(inp, work, inp.tool, "offload", before, blobs=blobs)
        elif stored is None:
            quiet = Untouched(before)
        else:
            quiet = _rewrite(inp, work, stored.tool, "checkpoint", before, checkpoint=False)
        if inp.store_ok and work.tokens > limits.prepare_at:
            ahead = _fold_plan(inp, work, limits, before, blobs, "")
            if ahead is not None and not _covers_a_prefix(inp.prepared, ahead):
                return replace(quiet, prepare=ahead)
        return quiet

    # Over the trigger: fold the oldest turns into a summary, else pack, to the target;
    # the outcome is frozen in a new checkpoint.
    reason = "" if inp.store_ok else "store_unavailable"
    if inp.tool is None and inp.store_ok:
        reason = "offload_off"
    planned = _fold_plan(inp, work, limits, before, blobs, reason)
    if planned is None:
        if inp.store_ok:
            reason = reason or "no_fold"
        return _pack(inp, work, limits, before, blobs, reason)
    ready = inp.prepared
    if ready is not None and ready.text is not None:
        if ready.folds == planned.folds:
            return fold(replace(planned, key=ready.key), ready.text, summary="ahead")
        adopted = _adopted(planned, ready)
        if isinstance(adopted, Rewrite) and adopted.estimate <= limits.trigger:
            return adopted
    covered = _covers_a_prefix(ready, planned)
    if work.tokens <= limits.defer_at and not (covered and ready is not None and ready.failed):
        # Its summary is not ready: go on unfolded (the window still has room) and have
        # it made in the background, rather than make this turn wait for it. (When the
        # summariser failed at it, the fold asks for it now.)
        prepare = None if covered else planned
        if not blobs and stored is None:
            return Untouched(before, prepare=prepare, reason="summary_pending")
        strategy = "offload" if blobs else "checkpoint"
        tool = inp.tool if blobs or (stored is not None and stored.tool) else None
        deferred = _rewrite(inp, work, tool, strategy, before, blobs=blobs, checkpoint=bool(blobs))
        return replace(deferred, reason="summary_pending", prepare=prepare)
    if covered and ready is not None and ready.pending:
        # At the wait point with the summary of the oldest groups still being made
        # ahead: wait for that one (what is left of its call, paid once) rather than
        # have a second summary made now, when folding those groups is enough.
        awaited = _awaited(planned, ready)
        if awaited is not None:
            return awaited
    return planned


def _awaited(plan: FoldPlan, ready: PreparedSummary) -> FoldPlan | None:
    """The fold of the oldest groups whose summary (`ready`) is being made ahead, when
    folding them brings the history under the trigger even with a summary as large as
    the policy allows; else None (the whole fold makes its own summary)."""
    labels = _prefix_keys(plan).get(ready.folds)
    if labels is None:
        return None
    work, limits, inp = plan.work, plan.limits, plan.inp
    kept = work.tokens - sum(g.tokens for g in work.groups if g.label in labels)
    room = limits.trigger - kept
    if room < math.ceil(inp.policy.summary_max_tokens / inp.factor):
        return None
    awaited = _folding(
        inp, work, limits, plan.tokens_before, plan.blobs, plan.reason, labels, room, ahead=True
    )
    return replace(awaited, key=ready.key)  # where the summary being made ahead will be


def _fold_plan(
    inp: PlanInput,
    work: Working,
    limits: Limits,
    before: int,
    blobs: list[tuple[str, str]],
    reason: str,
) -> FoldPlan | None:
    """The fold that brings `work` to the target (seed 000), with what its summariser
    needs; None when the planner refuses (nothing to fold, no room for a summary)."""
    if not inp.store_ok:
        return None
    turns = compaction_turns(work.groups)
    budget = limits.target - pinned_tokens(work.groups)
    planned = plan_compaction(turns, budget, inp.policy.keep_last)
    if planned is None or not planned[0]:
        return None
    return _folding(inp, work, limits, before, blobs, reason, frozenset(planned[0]), planned[2])


def _folding(
    inp: PlanInput,
    work: Working,
    limits: Limits,
    before: int,
    blobs: list[tuple[str, str]],
    reason: str,
    fold: frozenset[str],
    room: int,
    *,
    ahead: bool = False,
) -> FoldPlan:
    """The fold of the groups labelled `fold`, its summary taking at most `room`
    (estimated) tokens, with what its summariser needs."""
    members = [m for g in work.groups if g.label in fold for m in g.members]
    slot = min(real(room, inp.factor), inp.policy.summary_max_tokens)
    facts_budget = min(FACTS_MAX, max(FACTS_MIN, slot // 5))
    folds = summary_key(work.segments, members, inp.digests)
    return FoldPlan(
        key=seen_key(folds, inp.digests),
        folds=folds,
        transcript=_transcript(work, members, inp, slot),
        in_place=_in_place(work, members, inp, limits, slot),
        slot=max(slot - facts_budget, slot // 2),
        facts=Facts(tuple(_facts_sources(work, members, inp)), _call_ids(work, members)),
        facts_budget=facts_budget,
        model=inp.policy.summariser_model,
        inp=inp,
        work=work,
        limits=limits,
        fold=fold,
        tokens_before=before,
        blobs=blobs,
        reason=reason,
        ahead=ahead,
    )


def _prefix_keys(plan: FoldPlan) -> dict[str, frozenset[str]]:
    """The summary key of every run of the fold's oldest groups, to the labels it folds."""
    work = plan.work
    folded = [g for g in work.groups if g.label in plan.fold]
    keys: dict[str, frozenset[str]] = {}
    parts: list[int] = []
    for n, group in enumerate(folded):
        parts.extend(group.members)
        key = summary_key(work.segments, parts, plan.inp.digests)
        keys[key] = frozenset(g.label for g in folded[: n + 1])
    return keys


def _covers_a_prefix(prepared: PreparedSummary | None, plan: FoldPlan) -> bool:
    """Whether a summary made (or being made) ahead folds some oldest groups of `plan`
    (it was made from what this history begins with: the planner is given no other)."""
    return prepared is not None and prepared.folds in _prefix_keys(plan)


def _adopted(plan: FoldPlan, ready: PreparedSummary) -> Rewrite | Refuse | None:
    """The fold of the oldest groups a summary made ahead covers (fewer than `plan`
    would fold: the turns since stay verbatim), or None when it covers none of them."""
    labels = _prefix_keys(plan).get(ready.folds)
    if labels is None or ready.text is None:
        return None
    return fold(replace(plan, key=ready.key, fold=labels), ready.text, summary="ahead")


def fold(need: FoldPlan, text: str | None, *, summary: str) -> Rewrite | Refuse:
    """Complete a crossing with the summary (None: there is none, so pack instead);
    `summary` says how it was had (SUMMARY_STATES)."""
    inp, work = need.inp, need.work
    if text is None or not text.strip():
        reason = need.reason or "summary_unavailable"
        return _pack(inp, work, need.limits, need.tokens_before, need.blobs, reason)
    folded = [g for g in work.groups if g.label in need.fold]
    count = sum(stands_for(work.segments[m]) for g in folded for m in g.members)
    text = text.strip()
    # The refs it may make readable: those it names that the proxy put into what it
    # folds (its stubs, an earlier summary's refs); never one the client typed there.
    made = set(vouched_refs([work.segments[m] for g in folded for m in g.members]))
    folded_into = Summary(text, count, tuple(r for r in refs_in(text) if r in made))
    segments: list[Segment] = []
    for group in work.groups:
        if group.kind is GroupKind.MALFORMED:
            continue  # the API would reject it; dropping needs no note (seed 001)
        if group.label in need.fold:
            if group is folded[0]:
                segments.append(folded_into)  # where the folded history began
            continue
        segments.extend(work.segments[m] for m in group.members)
    done = working(segments, inp)
    if done.tokens > need.limits.limit:
        return _pack(inp, work, need.limits, need.tokens_before, need.blobs, need.reason)
    # Every blob is kept: the summary may name the refs of the results it folded.
    return _rewrite(
        inp,
        done,
        inp.tool if _has_stubs(segments) or inp.sticky_tool or folded_into.refs else None,
        "offload+summary" if need.blobs else "summary",
        need.tokens_before,
        blobs=need.blobs,
        summary=summary,
        summary_key=need.key,
        reason=need.reason,
    )


def recovered_blobs(inp: PlanInput, refs: Collection[str]) -> list[tuple[str, str]]:
    """The blobs of `refs` rebuilt from the client's own messages (a ref is its text's
    hash): the client still sends every result the proxy offloaded or folded."""
    wanted = set(refs)
    found: dict[str, str] = {}
    for message in inp.messages:
        for _, block in inp.dialect.tool_results(message):
            text = result_text(block)
            if text is not None and (ref := ref_for(text)) in wanted:
                found[ref] = text
    return list(found.items())


def without_blobs(inp: PlanInput) -> Outcome:
    """The plan again after the crossing's writes failed: nothing offloaded (a stub whose
    blob was not kept could never be read), nothing to keep; a fold may still use the
    summary already made for it (the key does not depend on offloading)."""
    return plan(replace(inp, offload_ok=False, checkpoint=None))


def _alone(inp: PlanInput) -> Outcome:
    """A plan for this request only: no checkpoint applied, nothing offloaded or stored."""
    outcome = plan(replace(inp, checkpoint=None, store_ok=False))
    if isinstance(outcome, Rewrite):
        return replace(outcome, checkpoint=None, alone=True, reason="", blobs=[])
    return outcome


# The line of identifiers a summary left out (proxy/core/facts.py) may take a fifth of the
# summary's slot, at least FACTS_MIN and at most FACTS_MAX tokens; the summariser keeps at
# least half of the slot (a small slot may so end a little over the target).
FACTS_MIN, FACTS_MAX = 200, 1_500
SUMMARISER_MARGIN = 0.05  # of the summariser's window kept free: counts are estimates


def summariser_room(policy: Policy, factor: float) -> int:
    """The summariser's window in estimated tokens: SUMMARISER_MARGIN of it kept free,
    and never grown by a factor below 1 (plain text counts about as estimated)."""
    return math.floor(policy.window * (1 - SUMMARISER_MARGIN) / max(1.0, factor))


@dataclass(frozen=True, slots=True)
class WholeSummary:
    """How a summary of a whole history as sent is asked (a compaction the proxy serves):
    in place, the conversation's own request with the proxy's ask last (its prefix read
    from the prompt cache), or a transcript of its own cut to the summariser's window."""

    model: str  # the summariser
    room: int  # its window, estimated tokens (summariser_room)
    in_place: int  # what the in-place call reads, estimated; 0: a transcript instead


def whole_summary(
    policy: Policy, factor: float, model: str, history_tokens: Callable[[], int]
) -> WholeSummary:
    """In place when the summariser is the conversation's model and the history
    (`history_tokens`, counted only then), the prompt's words and the summary's slot fit
    its window; else a transcript, by the policy's summariser."""
    room = summariser_room(policy, factor)
    if policy.summariser_model in ("", model):
        used = history_tokens() + IN_PLACE_OVERHEAD
        if used + policy.summary_max_tokens <= room:
            return WholeSummary(model, room, used)
    return WholeSummary(policy.summariser_model or model, room, 0)


def summary_key(
    segments: Sequence[Segment], members: Sequence[int], digests: Sequence[bytes]
) -> str:
    """Where the summary of these folded segments is stored: a hash of the turns as the
    client sent them (and of an earlier summary's text), so the same turns give the same
    key whether or not some of their results were offloaded."""
    parts: list[bytes] = []
    for m in members:
        seg = segments[m]
        if isinstance(seg, (Verbatim, Stubbed)):
            parts.append(digests[seg.index])
        else:
            parts.append(message_digest({"proxy": seg.text}))
    return chain_hash(parts)


def seen_key(folds: str, digests: Sequence[bytes]) -> str:
    """Where the summary of the turns `folds` made from a history of these messages is
    stored: made in place, its summariser reads the whole history (the newest turn
    included), so a line that shares only the folded turns must never find it."""
    return chain_hash([bytes.fromhex(folds), bytes.fromhex(chain_hash(digests))])


def _in_place(
    work: Working, members: Sequence[int], inp: PlanInput, limits: Limits, slot: int
) -> InPlace:
    """The conversation's history as it would go without the fold, and a last message
    naming the messages to replace, with the originals of the results offloaded among
    them (the summariser reads what the stubs hide), cut to what the window leaves."""
    pieces: list[str] = []
    tokens: list[int] = []
    for m in members:
        seg = work.segments[m]
        if isinstance(seg, Stubbed):
            original = inp.dialect.render_transcript([inp.messages[seg.index]])
            pieces.append(f"[{', '.join(seg.refs)}]\n{original}")
            tokens.append(inp.counts[seg.index])
    # The originals are plain text, which counts about as estimated: a factor below 1
    # (learnt on requests whose sealed content the estimate overcounts) must not let them
    # grow, so the window is taken in real tokens then.
    factor = max(1.0, inp.factor)
    limit = min(limits.limit, math.floor(inp.policy.window / factor) - inp.fixed_tokens
                - inp.tool_tokens)  # fmt: skip
    room = limit - work.tokens - math.ceil(slot / factor) - IN_PLACE_OVERHEAD
    budget = min(room, _originals_cap(work, inp))
    # Each piece keeps a head and a tail when cut: past what the budget holds of those,
    # the newest pieces only.
    fit = max(budget, 0) // MIN_PIECE_TOKENS
    originals = _fitted(pieces[-fit:], tokens[-fit:], budget) if fit else ""
    first, last = members[0], members[-1]
    heads = (
        _head_of(work.messages[first], inp.dialect),
        _head_of(work.messages[last], inp.dialect),
    )
    prompt = in_place_prompt(first + 1, last + 1, heads, originals)
    return InPlace(
        work.messages, _last_stub(work.segments), prompt, fits=room >= 0, tool=_tool_of(work, inp)
    )


def _tool_of(work: Working, inp: PlanInput) -> str | None:
    """The name read_result is injected under in the request `work` would make."""
    named = _has_stubs(work.segments) or inp.sticky_tool or named_refs(work.segments)
    return inp.tool if named else None


IN_PLACE_OVERHEAD = 600  # tokens of the in-place prompt's own words, with a margin
# What the in-place call reads from the cache at least, as a share of its prompt: what
# follows the cached prefix (the prompt's words and the originals of the folded turns'
# offloaded results) is paid at the full input price, on every summary.
IN_PLACE_READ_SHARE = 0.92  # 0.9, with a margin for the estimate
MIN_PIECE_TOKENS = 150  # what a piece cut to its head and tail still takes, about


def _originals_cap(work: Working, inp: PlanInput) -> int:
    """Tokens the originals may take so the cached prefix (tools, system, the history as
    the conversation sent it) stays IN_PLACE_READ_SHARE of the in-place call's prompt."""
    cached = inp.fixed_tokens + inp.tool_tokens + work.tokens
    uncached = math.floor(cached * (1 - IN_PLACE_READ_SHARE) / IN_PLACE_READ_SHARE)
    return max(uncached - IN_PLACE_OVERHEAD, 0)


def _head_of(message: Message, dialect: Dialect) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict):
            for key in ("text", "content"):
                value = block.get(key)
                if isinstance(value, str) and value.strip():
                    return value
    # A message of another shape (a Responses unit): its text as the summariser reads it.
    lines = dialect.render_transcript([message]).splitlines()
    return lines[1] if len(lines) > 1 else str(message.get("role", ""))


def _original(seg: Segment, work: Working, m: int, inp: PlanInput) -> Message:
    """What the summariser reads for a folded segment: the client's message itself (its
    results whole, never stubs), or the summary or note the proxy wrote."""
    if isinstance(seg, (Verbatim, Stubbed)):
        return inp.messages[seg.index]
    return work.messages[m]


def _transcript(work: Working, members: Sequence[int], inp: PlanInput, slot: int) -> str:
    """The folded turns as the client sent them, as text for the summariser, cut to fit
    its window: the longest pieces first, each keeping its head and its tail. Offloaded
    results say their ref, so the summary can name what the agent may still read."""
    pieces: list[str] = []
    tokens: list[int] = []
    for m in members:
        seg = work.segments[m]
        message = _original(seg, work, m, inp)
        text = inp.dialect.render_transcript([message])
        if isinstance(seg, Stubbed):
            refs = ", ".join(s.ref for s in seg.stubs)
            text += f"\n[offloaded tool results, readable with read_result: {refs}]"
        pieces.append(text)
        tokens.append(inp.counts[seg.index] if isinstance(seg, (Verbatim, Stubbed)) else
                      work.shapes[m].tokens)  # fmt: skip
    # Plain text counts about as estimated: a factor below 1 (learnt on requests whose
    # sealed content the estimate overcounts) must not let the transcript grow.
    factor = max(1.0, inp.factor)
    window = summariser_room(inp.policy, factor)
    budget = window - math.ceil(slot / factor) - inp.counter.count_text(INSTRUCTION)
    return _fitted(pieces, tokens, max(budget, len(pieces) * 64))


def _fitted(pieces: Sequence[str], tokens: Sequence[int], budget: int) -> str:
    """The pieces joined, the longest cut first (each keeping its head and its tail)
    until their tokens (given, per piece) fit `budget`."""
    cap = _water_level(tokens, budget)
    out = []
    for text, count in zip(pieces, tokens, strict=True):
        if count > cap:
            keep = max(200, len(text) * cap // max(count, 1))
            half = keep // 2
            cut = len(text) - 2 * half
            text = f"{text[:half]}\n[... {cut:,} characters cut ...]\n{text[-half:]}"
        out.append(text)
    return "\n\n".join(out)


def _water_level(sizes: Sequence[int], budget: int) -> int:
    """The largest cap such that the sizes, each capped at it, sum to at most `budget`
    (cutting the largest first); the largest size itself when everything fits."""
    if sum(sizes) <= budget:
        return max(sizes, default=0)
    ordered = sorted(sizes)
    remaining, left = budget, len(ordered)
    for size in ordered:
        if size * left > remaining:
            return max(1, remaining // left)
        remaining -= size
        left -= 1
    return max(1, remaining)


def _call_ids(work: Working, members: Sequence[int]) -> frozenset[str]:
    return frozenset(i for m in members for i in (*work.shapes[m].calls, *work.shapes[m].answers))


def _facts_sources(work: Working, members: Sequence[int], inp: PlanInput) -> list[Source]:
    sources = []
    for m in members:
        seg = work.segments[m]
        message = _original(seg, work, m, inp)
        if made_here(seg):
            kind = EARLIER_SUMMARY
        elif inp.dialect.tool_results(message):
            kind = TOOL_RESULT
        else:
            kind = CONVERSATION
        sources.append(Source(kind, inp.dialect.render_transcript([message])))
    return sources


# -- steps -------------------------------------------------------------------------


def _offload(work: Working, inp: PlanInput) -> tuple[Working, list[tuple[str, str]]]:
    """Stub every large text tool result but the newest few; already stubbed ones stay."""
    policy = inp.policy
    candidates: list[tuple[int, int, Mapping[str, Any]]] = []  # (segment, slot, result)
    for n, seg in enumerate(work.segments):
        if not isinstance(seg, (Verbatim, Stubbed)):
            continue
        done = {s.block for s in seg.stubs} if isinstance(seg, Stubbed) else set()
        for at, block in inp.dialect.tool_results(work.messages[n]):
            if at not in done:
                candidates.append((n, at, block))
    # The newest results stay, and so does every result given in the same message as one.
    newest = candidates[len(candidates) - policy.keep_results :] if policy.keep_results else []
    protected = {n for n, _, _ in newest}
    stubs: dict[int, list[Stub]] = {}
    blobs: list[tuple[str, str]] = []
    for n, at, block in candidates:
        if n in protected:
            continue
        text = result_text(block)
        if text is None or len(text) <= policy.stub_head_chars:
            continue
        if inp.counter.count_block(dict(block)) <= policy.offload_threshold:
            continue
        ref = ref_for(text)
        stubs.setdefault(n, []).append(Stub(at, ref, policy.stub_head_chars))
        blobs.append((ref, text))
    if not stubs:
        return work, []
    segments: list[Segment] = []
    for n, seg in enumerate(work.segments):
        if n not in stubs:
            segments.append(seg)
            continue
        assert isinstance(seg, (Verbatim, Stubbed))
        earlier = list(seg.stubs) if isinstance(seg, Stubbed) else []
        merged = tuple(sorted(earlier + stubs[n], key=lambda s: s.block))
        segments.append(Stubbed(seg.index, merged))
    return rebuilt(work, segments, stubs.keys(), inp), blobs


def _pack(
    inp: PlanInput,
    work: Working,
    limits: Limits,
    before: int,
    blobs: list[tuple[str, str]],
    reason: str = "",
) -> Rewrite | Refuse:
    """Drop the oldest groups with a note (seed 001): to the target, else to the window."""
    packed = pack_messages(work.groups, work.shapes)
    result = pack_context(packed, limits.target, limits.note)
    if result is None:
        result = pack_context(packed, limits.limit, limits.note)
    if result is None:
        return _refuse(inp, work, limits)
    keep = set(result["keep"])
    dropped = sum(stands_for(seg) for n, seg in enumerate(work.segments) if n not in keep)
    segments: list[Segment] = []
    pending_note = False
    noted = not result["note"]
    for n, seg in enumerate(work.segments):
        if n not in keep:
            pending_note = not noted
            continue
        if pending_note:  # one note, where the dropped history began
            segments.append(Note(note_text(dropped), dropped))
            pending_note, noted = False, True
        segments.append(seg)
    done = working(segments, inp)
    kept = set(refs_of(segments))
    blobs = [(ref, text) for ref, text in blobs if ref in kept]
    strategy = "offload+pack" if blobs else "pack"
    if done.tokens > limits.trigger:
        reason = reason or "target_unreachable"
    tool = inp.tool if kept or inp.sticky_tool or named_refs(segments) else None
    return _rewrite(inp, done, tool, strategy, before, blobs=blobs, reason=reason)


def _refuse(inp: PlanInput, work: Working, limits: Limits) -> Refuse:
    pinned = real(pinned_tokens(work.groups), inp.factor)
    fixed = real(inp.fixed_tokens + inp.tool_tokens, inp.factor)
    need = pinned + real(limits.note, inp.factor) + fixed
    window = inp.policy.window
    return Refuse(
        f"prompt is too long even after compaction: the system prompt and tools ({fixed}"
        f" tokens) and the messages that cannot be dropped (system messages, the last user"
        f" message and the turn in progress: {pinned} tokens) need about {need} tokens,"
        f" {need - window} more than the {window}-token window."
    )


def _rewrite(
    inp: PlanInput,
    work: Working,
    tool: str | None,
    strategy: str,
    before: int,
    *,
    blobs: list[tuple[str, str]] | None = None,
    checkpoint: bool = True,
    summary: str = "",
    summary_key: str | None = None,
    reason: str = "",
) -> Rewrite:
    stored = None
    if checkpoint:
        stored = make_checkpoint(
            work.segments,
            inp.digests,
            tool=tool,
            strategy=strategy,
            summary_key=summary_key,
            tokens_after=work.tokens,
        )
    if not summary and any(isinstance(seg, Summary) for seg in work.segments):
        summary = "reused"  # the history sent holds a summary made at an earlier crossing
    if inp.tool is None and reason == "" and strategy != "checkpoint":
        reason = "offload_off"
    return Rewrite(
        messages=work.messages,
        tool=tool,
        strategy=strategy,
        tokens_before=before,
        tokens_after=real(work.tokens, inp.factor),
        estimate=work.tokens,
        blobs=blobs or [],
        checkpoint=stored,
        refs=named_refs(work.segments),
        breakpoint_at=_last_stub(work.segments),
        summary=summary,
        reason=reason,
    )


# -- helpers -----------------------------------------------------------------------


def working(segments: list[Segment], inp: PlanInput) -> Working:
    messages = []
    shapes = []
    for seg in segments:
        if isinstance(seg, Verbatim):
            message = dict(inp.messages[seg.index])
            counted = inp.counts[seg.index]
        elif isinstance(seg, Stubbed):
            message, counted = _stubbed(seg, inp)
        else:
            message = material(seg, inp.messages, inp.tool, inp.policy.read_length, inp.dialect)
            counted = inp.counter.count_message(message)
        messages.append(message)
        shape = inp.dialect.message_shape(message, counted)
        if made_here(seg):
            shape = Shape(shape.role, shape.tokens, made_here=True)
        shapes.append(shape)
    return Working(segments, messages, shapes, group_history(shapes))


def rebuilt(
    work: Working, segments: list[Segment], changed: Collection[int], inp: PlanInput
) -> Working:
    """`working(segments, inp)` when only the segments at `changed` differ from work's:
    the others' messages and shapes are kept (an offload step stubs a result or two of a
    long history, and building every message's shape again was half of its cost)."""
    messages, shapes = list(work.messages), list(work.shapes)
    for n in changed:
        one = working([segments[n]], inp)
        messages[n], shapes[n] = one.messages[0], one.shapes[0]
    return Working(segments, messages, shapes, group_history(shapes))


def _stubbed(seg: Stubbed, inp: PlanInput) -> tuple[dict[str, Any], int]:
    """A stubbed message and its count: built, or reused from an earlier request that
    built it from the same original (the checkpoint's stubs, reapplied every turn)."""
    memo, read_length = inp.stubbed, inp.policy.read_length
    form = inp.forms[seg.index] if seg.index < len(inp.forms) else -1
    key = b""
    if memo is not None and form in REBUILDABLE_FORMS:
        key = stubbed_key(inp.digests[seg.index], form, seg, inp.tool, read_length, inp.dialect)
        found = memo.get(key)
        if found is not None:
            return found
    message = material(seg, inp.messages, inp.tool, read_length, inp.dialect)
    made = message, inp.counter.count_message(message)
    if key and memo is not None:
        if len(memo) >= STUBBED_MEMO_SIZE:
            memo.clear()  # a bound, not a policy: a busy fleet refills it within a turn
        memo[key] = made
    return made


STUBBED_MEMO_SIZE = 8192  # stubbed messages (about 1 KB each with their heads)


def limits_of(inp: PlanInput) -> Limits:
    """The policy's numbers in estimated tokens, bounded by what the window allows."""
    factor = inp.factor if inp.factor > 0 else 1.0
    policy = inp.policy
    limit = math.floor(policy.window / factor) - inp.fixed_tokens - inp.tool_tokens
    trigger = min(math.floor(policy.trigger_tokens / factor), limit)
    target = min(math.floor(policy.target_tokens / factor), trigger)
    offload_at = min(math.floor(policy.offload_tokens / factor), trigger)
    note = math.ceil(policy.note_cost / factor)
    return Limits(limit, offload_at, trigger, target, note, math.floor(policy.window / factor))


def _recross_at(limits: Limits, stored: Checkpoint | None) -> int:
    """The history size that makes a new crossing: the trigger. A fold that landed above
    the target (its summary made ahead folded fewer turns) does not move it, nor the
    prepare and wait points with it. Only a checkpoint that could not get under the
    trigger at all (what cannot be dropped is larger) keeps the hysteresis from where it
    got to, so identical resends reuse it instead of compacting again every time."""
    folded = stored is not None and ("summary" in stored.strategy or "pack" in stored.strategy)
    if stored is None or not folded or stored.tokens_after <= limits.trigger:
        return limits.trigger
    gap = limits.trigger - limits.target
    return min(limits.limit, max(limits.trigger, stored.tokens_after + gap))


def real(estimate: int, factor: float) -> int:
    return math.ceil(estimate * factor)


def named_refs(segments: Sequence[Segment]) -> list[str]:
    """Every ref the history may read: its stubs', then those its summaries vouch for
    (never a ref-shaped string a client wrote, quoted or not)."""
    return vouched_refs(segments)


def _last_stub(segments: Sequence[Segment]) -> int | None:
    return next(
        (n for n in range(len(segments) - 1, -1, -1) if isinstance(segments[n], Stubbed)), None
    )


def _has_stubs(segments: Sequence[Segment]) -> bool:
    return any(isinstance(seg, Stubbed) for seg in segments)
