"""The rewrite planner: what to do with one request's history (DESIGN section 5).

`plan_request` is a pure function of the request's messages, the conversation's stored
checkpoint and the policy. It answers with one of:

- `Untouched`: the history fits and no checkpoint applies: forward the original bytes;
- `Rewrite`: the messages to send, plus the effects the server must carry out (blobs
  to store, the new checkpoint);
- `NeedSummary`: a crossing that wants a summary; the server fetches a stored one or asks
  the summariser, then calls `finish_with_summary` (None when it could not get one,
  which falls back to packing);
- `Refuse`: nothing fits; the message says what and by how much.

Counts are local estimates; the policy's numbers are real tokens, so they are divided
by the calibration factor (real / estimated) once, and all the planning below happens in
estimated units.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.core.checkpoint import (
    Segment,
    chain_hash,
    made_here,
    make_checkpoint,
    materialise,
    message_digest,
    segments_for,
)
from proxy.core.compaction import plan_compaction
from proxy.core.dialect import Dialect
from proxy.core.history import (
    Group,
    GroupKind,
    Shape,
    compaction_turns,
    group_history,
    pack_messages,
    pinned_tokens,
)
from proxy.core.offload import ref_for, result_text
from proxy.core.pack import pack_context
from proxy.core.policy import Policy
from proxy.core.summary import note_text
from proxy.wire.anthropic import ANTHROPIC

Message = Mapping[str, Any]


class Counter(Protocol):
    def count_message(self, message: dict[str, Any]) -> int: ...
    def count_block(self, block: object) -> int: ...


@dataclass(frozen=True, slots=True)
class PlanInput:
    messages: Sequence[Message]
    digests: Sequence[bytes]  # message_digest of each message
    checkpoint: Mapping[str, Any] | None
    policy: Policy
    counter: Counter
    fixed_tokens: int  # system prompt + tools, estimated
    tool_tokens: int  # the read_result definition, estimated
    tool: str | None  # the name read_result goes by; None = offload is off
    factor: float = 1.0  # calibration: real tokens / estimated tokens
    counts: Sequence[int] = ()  # count_message of each message, when the caller has them
    store_ok: bool = True  # blobs and summaries can be stored
    dialect: Dialect = ANTHROPIC  # the wire format of the messages


@dataclass(frozen=True, slots=True)
class Untouched:
    tokens: int  # history, calibrated


@dataclass(frozen=True, slots=True)
class Refuse:
    message: str


@dataclass(frozen=True, slots=True)
class Rewrite:
    messages: list[dict[str, Any]]
    tool: str | None  # inject read_result under this name
    strategy: str
    tokens_before: int  # history, calibrated
    tokens_after: int
    blobs: list[tuple[str, str]] = field(default_factory=list)  # (ref, text) to store
    checkpoint: dict[str, Any] | None = None  # to store; None: the stored one holds
    refs: list[str] = field(default_factory=list)  # every stub in the history
    summary: str = ""  # "made", "reused" or ""
    estimate: int = 0  # the rewritten history in estimated tokens (for calibration)


@dataclass(frozen=True, slots=True)
class _Working:
    """A history under construction: segments and the messages they stand for."""

    segments: list[Segment]
    messages: list[dict[str, Any]]
    shapes: list[Shape]
    groups: list[Group]

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shapes)


@dataclass(frozen=True, slots=True)
class _Limits:
    limit: int  # the most history the window allows, estimated
    trigger: int
    target: int
    note: int


@dataclass(frozen=True, slots=True)
class NeedSummary:
    key: str  # hash of the folded messages: where the summary is stored
    transcript: str  # the folded messages as text, for the summariser
    slot: int  # the summary's cap, in real tokens
    model: str  # summariser model ("" = the request's)
    _inp: PlanInput
    _work: _Working
    _limits: _Limits
    _fold: frozenset[str]
    _before: int
    _blobs: list[tuple[str, str]]


def plan_request(inp: PlanInput) -> Untouched | Rewrite | Refuse | NeedSummary:
    segments, applied = segments_for(inp.checkpoint, inp.digests)
    stored_tool = inp.checkpoint.get("tool") if applied and inp.checkpoint else None
    if applied and stored_tool and stored_tool != inp.tool:
        segments, applied = segments_for(None, inp.digests)  # the client took the name
    work = _working(segments, inp)
    limits = _limits(inp)
    # What the client sent, not what an earlier rewrite made of it.
    before = _real(sum(_original_counts(inp)), inp.factor)
    if work.tokens <= limits.trigger:
        if not applied:
            return Untouched(before)
        tool = stored_tool if _has_stubs(segments) else None
        return _rewrite(inp, work, tool, "checkpoint", before, checkpoint=False)

    # A crossing: offload, then fold, then pack; the outcome is frozen in a new checkpoint.
    blobs: list[tuple[str, str]] = []
    if inp.tool and inp.store_ok:
        work, blobs = _offload(work, inp)
        if work.tokens <= limits.target:
            return _rewrite(inp, work, inp.tool, "offload", before, blobs=blobs)

    turns = compaction_turns(work.groups)
    budget = limits.target - pinned_tokens(work.groups)
    plan = plan_compaction(turns, budget, inp.policy.keep_last)
    if plan is not None and plan[0] and inp.store_ok:
        fold = frozenset(plan[0])
        folded = [work.messages[m] for g in work.groups if g.label in fold for m in g.members]
        key = chain_hash([message_digest(m) for m in folded])
        slot = min(_real(plan[2], inp.factor), inp.policy.summary_max_tokens)
        return NeedSummary(
            key=key,
            transcript=inp.dialect.render_transcript(folded),
            slot=slot,
            model=inp.policy.summariser_model,
            _inp=inp,
            _work=work,
            _limits=limits,
            _fold=fold,
            _before=before,
            _blobs=blobs,
        )
    return _pack(inp, work, limits, before, blobs)


def finish_with_summary(need: NeedSummary, text: str | None, *, reused: bool) -> Rewrite | Refuse:
    """Complete a crossing with the summary the server got (None: it could not get one)."""
    inp, work = need._inp, need._work
    if text is None or not text.strip():
        return _pack(inp, work, need._limits, need._before, need._blobs)
    folded = [g for g in work.groups if g.label in need._fold]
    count = sum(_stands_for(work.segments[m]) for g in folded for m in g.members)
    summary: Segment = ["summary", text.strip(), count]
    segments: list[Segment] = []
    for group in work.groups:
        if group.kind is GroupKind.MALFORMED:
            continue  # the API would reject it; dropping needs no note (seed 001)
        if group.label in need._fold:
            if group is folded[0]:
                segments.append(summary)  # where the folded history began
            continue
        segments.extend(work.segments[m] for m in group.members)
    done = _working(segments, inp)
    if done.tokens > need._limits.limit:
        return _pack(inp, work, need._limits, need._before, need._blobs)
    strategy = "offload+summary" if need._blobs else "summary"
    return _rewrite(
        inp,
        done,
        inp.tool if _has_stubs(segments) else None,
        strategy,
        need._before,
        blobs=need._blobs,
        summary="reused" if reused else "made",
        summary_key=need.key,
    )


# -- steps -------------------------------------------------------------------------


def _offload(work: _Working, inp: PlanInput) -> tuple[_Working, list[tuple[str, str]]]:
    """Stub every large text tool result but the newest few; already stubbed ones stay."""
    policy = inp.policy
    candidates: list[tuple[int, int, dict[str, Any]]] = []  # (segment, block, block)
    for n, seg in enumerate(work.segments):
        if seg[0] not in ("m", "s"):
            continue
        done = {block for block, _, _ in seg[2]} if seg[0] == "s" else set()
        for b, block in inp.dialect.tool_results(work.messages[n]):
            if b not in done:
                candidates.append((n, b, dict(block)))
    # The newest results stay, and so does every result given in the same message as one.
    newest = candidates[len(candidates) - policy.keep_results :] if policy.keep_results else []
    protected = {n for n, _, _ in newest}
    eligible = [c for c in candidates if c[0] not in protected]
    stubs: dict[int, list[list[Any]]] = {}
    blobs: list[tuple[str, str]] = []
    for n, b, block in eligible:
        text = result_text(block)
        if text is None or len(text) <= policy.stub_head_chars:
            continue
        if inp.counter.count_block(block) <= policy.offload_threshold:
            continue
        ref = ref_for(text)
        stubs.setdefault(n, []).append([b, ref, policy.stub_head_chars])
        blobs.append((ref, text))
    if not stubs:
        return work, []
    segments: list[Segment] = []
    for n, seg in enumerate(work.segments):
        if n not in stubs:
            segments.append(seg)
            continue
        earlier = list(seg[2]) if seg[0] == "s" else []
        segments.append(["s", seg[1], sorted(earlier + stubs[n])])
    return _working(segments, inp), blobs


def _pack(
    inp: PlanInput, work: _Working, limits: _Limits, before: int, blobs: list[tuple[str, str]]
) -> Rewrite | Refuse:
    """Drop the oldest groups with a note (seed 001): to the target, else to the window."""
    packed = pack_messages(work.groups, work.shapes)
    result = pack_context(packed, limits.target, limits.note)
    if result is None:
        result = pack_context(packed, limits.limit, limits.note)
    if result is None:
        return _refuse(inp, work, limits)
    keep = set(result["keep"])
    dropped = sum(_stands_for(seg) for n, seg in enumerate(work.segments) if n not in keep)
    segments: list[Segment] = []
    pending_note = False
    noted = not result["note"]
    for n, seg in enumerate(work.segments):
        if n not in keep:
            pending_note = not noted
            continue
        if pending_note:  # one note, where the dropped history began
            segments.append(["note", note_text(dropped)])
            pending_note, noted = False, True
        segments.append(seg)
    done = _working(segments, inp)
    strategy = "offload+pack" if blobs else "pack"
    tool = inp.tool if _has_stubs(segments) else None
    return _rewrite(inp, done, tool, strategy, before, blobs=blobs)


def _refuse(inp: PlanInput, work: _Working, limits: _Limits) -> Refuse:
    pinned = _real(pinned_tokens(work.groups), inp.factor)
    fixed = _real(inp.fixed_tokens + inp.tool_tokens, inp.factor)
    need = pinned + _real(limits.note, inp.factor) + fixed
    window = inp.policy.window
    return Refuse(
        f"prompt is too long even after compaction: the system prompt and tools ({fixed}"
        f" tokens) and the messages that cannot be dropped (system messages, the last user"
        f" message and the turn in progress: {pinned} tokens) need about {need} tokens,"
        f" {need - window} more than the {window}-token window."
    )


def _rewrite(
    inp: PlanInput,
    work: _Working,
    tool: str | None,
    strategy: str,
    before: int,
    *,
    blobs: list[tuple[str, str]] | None = None,
    checkpoint: bool = True,
    summary: str = "",
    summary_key: str | None = None,
) -> Rewrite:
    stored = None
    if checkpoint:
        stored = make_checkpoint(
            work.segments, inp.digests, tool=tool, strategy=strategy, summary_key=summary_key
        )
    refs = [ref for seg in work.segments if seg[0] == "s" for _, ref, _ in seg[2]]
    return Rewrite(
        messages=work.messages,
        tool=tool,
        strategy=strategy,
        tokens_before=before,
        tokens_after=_real(work.tokens, inp.factor),
        estimate=work.tokens,
        blobs=blobs or [],
        checkpoint=stored,
        refs=refs,
        summary=summary,
    )


# -- helpers -----------------------------------------------------------------------


def _working(segments: list[Segment], inp: PlanInput) -> _Working:
    messages = materialise(
        segments, inp.messages, inp.tool, inp.policy.read_length, dialect=inp.dialect
    )
    counts = _original_counts(inp)
    shapes = []
    for seg, message in zip(segments, messages, strict=True):
        counted = counts[seg[1]] if seg[0] == "m" else inp.counter.count_message(message)
        shape = inp.dialect.message_shape(message, counted)
        if made_here(seg):
            shape = Shape(shape.role, shape.tokens, made_here=True)
        shapes.append(shape)
    return _Working(segments, messages, shapes, group_history(shapes))


def _original_counts(inp: PlanInput) -> Sequence[int]:
    if len(inp.counts) == len(inp.messages):
        return inp.counts
    return [inp.counter.count_message(dict(m)) for m in inp.messages]


def _limits(inp: PlanInput) -> _Limits:
    """The policy's numbers in estimated tokens, bounded by what the window allows."""
    factor = inp.factor if inp.factor > 0 else 1.0
    policy = inp.policy
    limit = math.floor(policy.window / factor) - inp.fixed_tokens - inp.tool_tokens
    trigger = min(math.floor(policy.trigger_tokens / factor), limit)
    target = min(math.floor(policy.target_tokens / factor), trigger)
    return _Limits(limit, trigger, target, math.ceil(policy.note_cost / factor))


def _real(estimate: int, factor: float) -> int:
    return math.ceil(estimate * factor)


def _has_stubs(segments: Sequence[Segment]) -> bool:
    return any(seg[0] == "s" for seg in segments)


def _stands_for(segment: Segment) -> int:
    """How many of the client's messages a segment stands for."""
    if segment[0] == "summary":
        return int(segment[2])
    return 0 if segment[0] == "note" else 1
