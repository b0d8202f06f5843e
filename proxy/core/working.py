"""What the planner works on: its input, the policy's numbers in its units, and the
history it builds.

`PlanInput` is what the planner is given for one request. Counts are local estimates; the
policy's numbers are real tokens, so they are divided by the calibration factor (real /
estimated) once (`limits_of`), and all the planning happens in estimated units; `real`
turns an estimate back for what the client is told.

`working` builds a `Working` history from segments (`segments_for`: the checkpoint's and
the messages since, verbatim): the client's messages, the messages the proxy writes
(proxy/core/segments.py), and stubbed messages reused from the memo. A checkpoint's
stubs are reapplied to every later request of the conversation, so the same stubbed
message would be built and counted again on every turn; the shell keeps one memo for all
requests (`PlanInput.stubbed`), keyed by what the message is built from
(`stubbed_key`), bounded by STUBBED_MEMO_SIZE.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.checkpoint import Checkpoint
from proxy.core.commands import PreparedSummary
from proxy.core.digests import EXACT, STRING_AS_BLOCK
from proxy.core.estimate import margin
from proxy.core.history import Group, Shape, group_history
from proxy.core.lines import begins_with
from proxy.core.policy import Policy, prepare_at
from proxy.core.segments import Segment, Stubbed, StubbedMemo, Verbatim, made_here, material
from proxy.core.wire_format import Dialect, MessageCounter

Message = Mapping[str, Any]


# -- what the planner is given ----------------------------------------------------------

# Messages and shapes built for a line's segments, by the id of what they stand for (the
# client's message for a verbatim one, the stored segment for the rest): a conversation
# resends its history and reapplies its checkpoint every turn, and building every
# message's shape again was most of the planner's time on a long one. An entry holds
# those objects (so their ids stay theirs), the message a stub is made of, and what else
# the build read; it is used only where all of them are the same.
BuiltMemo = dict[int, tuple[object, object, tuple[object, ...], tuple[dict[str, Any], Shape]]]


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
    prepared: PreparedSummary | None = None  # a summary made ahead for this root
    forms: bytes = b""  # each message's digest form (Counted.forms); b"": nothing reused
    stubbed: StubbedMemo | None = None  # stubbed messages built by earlier requests
    # Each message's estimated tokens (Counted.uncertain; 0: counted exactly; (): all
    # exact): where they could decide, the planner asks for exact counts (`Recount`).
    uncertain: Sequence[int] = ()
    # What the line's earlier requests built of the same segments (the reuse cache's,
    # proxy/core/reuse.py); None: everything is built.
    built: BuiltMemo | None = None


@dataclass(frozen=True, slots=True)
class Limits:
    limit: int  # the most history the window allows, estimated
    offload_at: int  # from here on, results leaving the keep window are offloaded
    trigger: int  # over this, the oldest turns are folded
    target: int  # ... down to this
    note: int
    window: int  # the whole window, estimated (0: unknown, the deferral is the limit's)
    prepare_at: int  # from here on, the next fold's summary is made ahead, in the background
    # Over the trigger but under this, a fold whose summary is not ready yet waits for it
    # (the request goes on unfolded); over this, the request waits for it.
    defer_at: int


# How far past the trigger a fold may wait for its summary made ahead, as a share of the
# window (a turn or two of a chat-heavy session in a 200,000-token window).
DEFER_SHARE = 0.05


def limits_of(inp: PlanInput) -> Limits:
    """The policy's numbers in estimated tokens, bounded by what the window allows."""
    factor = inp.factor if inp.factor > 0 else 1.0
    policy = inp.policy
    window = math.floor(policy.window / factor)
    limit = window - inp.fixed_tokens - inp.tool_tokens
    trigger = min(math.floor(policy.trigger_tokens / factor), limit)
    target = min(math.floor(policy.target_tokens / factor), trigger)
    offload_at = min(math.floor(policy.offload_tokens / factor), trigger)
    note = math.ceil(policy.note_cost / factor)
    # The deferral is bounded by DEFER_SHARE of the window: every turn past the trigger
    # is paid at the larger size, so the fold must land at the trigger, not near the
    # window's edge.
    room = (limit - trigger) // 4
    if window:
        room = min(room, math.floor(window * DEFER_SHARE))
    defer_at = trigger + max(room, 0)
    return Limits(
        limit, offload_at, trigger, target, note, window, prepare_at(trigger, target), defer_at
    )


def real(estimate: int, factor: float) -> int:
    return math.ceil(estimate * factor)


# -- the history it builds ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Working:
    """A history under construction: segments and the messages they stand for."""

    segments: list[Segment]
    messages: list[dict[str, Any]]
    shapes: list[Shape]
    groups: list[Group]
    tokens: int  # of all shapes: the planner asks for it often
    # How far `tokens` may be from the exact count: the margin of the estimated counts
    # among the client's messages it sends as they came (Verbatim), and those messages.
    unsure: int = 0
    estimated: tuple[int, ...] = ()


def segments_for(
    checkpoint: Checkpoint | None, digests: Sequence[bytes]
) -> tuple[list[Segment], bool]:
    """(segments, applied): what a history is built from. The checkpoint's segments and
    the messages since, verbatim; or every message verbatim when there is no checkpoint
    or the agent edited its history since."""
    total = len(digests)
    if checkpoint is None or not begins_with(digests, checkpoint.covers, checkpoint.prefix_hash):
        return [Verbatim(i) for i in range(total)], False
    return [*checkpoint.segments, *(Verbatim(i) for i in range(checkpoint.covers, total))], True


def working(segments: list[Segment], inp: PlanInput) -> Working:
    messages = []
    shapes = []
    tokens = 0
    for seg in segments:
        message, shape = _built(seg, inp)
        messages.append(message)
        shapes.append(shape)
        tokens += shape.tokens
    unsure, estimated = _unsure(segments, inp)
    return Working(segments, messages, shapes, group_history(shapes), tokens, unsure, estimated)


def _unsure(segments: Sequence[Segment], inp: PlanInput) -> tuple[int, tuple[int, ...]]:
    """How far the tokens of a history built of these segments may be from their exact
    count (the margin of the estimated counts among its client messages as sent), and
    those messages."""
    if not inp.uncertain:
        return 0, ()
    estimated = tuple(
        seg.index for seg in segments if isinstance(seg, Verbatim) and inp.uncertain[seg.index]
    )
    return margin(sum(inp.uncertain[n] for n in estimated)), estimated


def _built(seg: Segment, inp: PlanInput) -> tuple[dict[str, Any], Shape]:
    """The message a segment stands for, and its shape: as an earlier request of the
    line built it when it stands for the very same things (`BuiltMemo`)."""
    memo = inp.built
    if memo is None:
        return _build(seg, inp)
    if isinstance(seg, Verbatim):  # the client's message, kept: by its object
        anchor: object = inp.messages[seg.index]
        source: object = None
        made: tuple[object, ...] = (inp.counts[seg.index], type(inp.dialect))
    else:  # the checkpoint's segment (one object per stored line), over its message
        anchor = seg
        source = inp.messages[seg.index] if isinstance(seg, Stubbed) else None
        made = (inp.tool, inp.policy.read_length, type(inp.dialect))
    found = memo.get(id(anchor))
    if found is not None and found[0] is anchor and found[1] is source and found[2] == made:
        return found[3]
    built = _build(seg, inp)
    memo[id(anchor)] = (anchor, source, made, built)
    return built


def _build(seg: Segment, inp: PlanInput) -> tuple[dict[str, Any], Shape]:
    if isinstance(seg, Verbatim):
        message = dict(inp.messages[seg.index])
        counted = inp.counts[seg.index]
    elif isinstance(seg, Stubbed):
        message, counted = stubbed_message(seg, inp)
    else:
        message = material(seg, inp.messages, inp.tool, inp.policy.read_length, inp.dialect)
        counted = inp.counter.count_message(message)
    shape = inp.dialect.message_shape(message, counted)
    if made_here(seg):
        shape = Shape(shape.role, shape.tokens, made_here=True)
    return message, shape


def rebuilt(
    work: Working, segments: list[Segment], changed: Collection[int], inp: PlanInput
) -> Working:
    """`working(segments, inp)` when only the segments at `changed` differ from work's:
    the others' messages and shapes are kept (an offload step stubs a result or two of a
    long history, and building every message's shape again was half of its cost)."""
    messages, shapes = list(work.messages), list(work.shapes)
    tokens = work.tokens
    regroup = False
    for n in changed:
        message, shape = _built(segments[n], inp)
        tokens += shape.tokens - shapes[n].tokens
        regroup = regroup or not _same_place(shape, shapes[n])
        messages[n], shapes[n] = message, shape
    if regroup:
        groups = group_history(shapes)
    else:
        # The same groups, those of the changed messages recounted. Groups cover the
        # history in order, each a run of messages (`group_history`), so a message's
        # group is the last one starting at or before it. (Here, not in a function of
        # its own: the walk, tests/bench/test_walk.py.)
        groups = list(work.groups)
        recount = set()
        for n in changed:
            recount.add(bisect_right(groups, n, key=lambda g: g.members[0]) - 1)
        for at in recount:
            group = groups[at]
            total = sum(shapes[m].tokens for m in group.members)
            groups[at] = Group(group.kind, group.members, total)
    unsure, estimated = _unsure(segments, inp)
    return Working(segments, messages, shapes, groups, tokens, unsure, estimated)


def _same_place(shape: Shape, was: Shape) -> bool:
    """Whether a message's new shape groups as its old one did: all `group_history` reads
    but its tokens (a stub changes a result's count, not the calls it answers)."""
    return (
        shape.role == was.role
        and shape.calls == was.calls
        and shape.answers == was.answers
        and shape.made_here == was.made_here
    )


def stubbed_message(seg: Stubbed, inp: PlanInput) -> tuple[dict[str, Any], int]:
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


def stubbed_key(
    digest: bytes, form: int, seg: Stubbed, tool: str | None, read_length: int, dialect: Dialect
) -> bytes:
    stubs = ";".join(f"{s.block},{s.ref},{s.head_chars}" for s in seg.stubs)
    made = f"{form}|{type(dialect).__name__}|{tool or 'read_result'}|{read_length}|{stubs}"
    return digest + made.encode()


# counting.Counted.forms whose digest pins the message exactly: its own bytes, or its
# string content read as one block (Chat's tool messages); never one taken without its
# cache_control (it may sit elsewhere in the bytes).
REBUILDABLE_FORMS = (EXACT, STRING_AS_BLOCK)
