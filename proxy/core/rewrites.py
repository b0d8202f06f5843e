"""The steps that turn a working history into an outcome: offload, fold, pack, refuse.

Each is a pure function of the plan's input and a `Working` history; `rewrite_of`
freezes what a step made into a `Rewrite` (its checkpoint, the refs it names, where the
proxy's cache breakpoint goes). Which step runs when is the planner's to decide
(proxy/core/planner.py).
"""

from __future__ import annotations

from collections.abc import Collection

from proxy.core.checkpoint import Checkpoint
from proxy.core.digests import chain_hash
from proxy.core.history import GroupKind, pack_messages, pinned_tokens
from proxy.core.offload import Stub, ToolResult, ref_for, refs_in
from proxy.core.outcome import FoldPlan, Refuse, Rewrite
from proxy.core.pack import pack_context
from proxy.core.segments import (
    Note,
    Segment,
    Stubbed,
    Summary,
    Verbatim,
    has_stubs,
    last_stub,
    refs_of,
    stands_for,
    vouched_refs,
)
from proxy.core.strategy import Strategy
from proxy.core.summary import note_text
from proxy.core.tokens import RESULT_FRAMING
from proxy.core.wire_format import MessageCounter
from proxy.core.working import Limits, PlanInput, Working, real, rebuilt, working


def offload(work: Working, inp: PlanInput, batch: int = 1) -> tuple[Working, list[tuple[str, str]]]:
    """Stub every large text tool result but the newest few; already stubbed ones stay.
    `batch`: none is stubbed until at least that many have aged (the history as sent
    then stays the same between batches: Codex's WebSocket frames stay incremental)."""
    policy = inp.policy
    candidates: list[tuple[int, ToolResult]] = []  # (segment, result)
    for n, seg in enumerate(work.segments):
        if not isinstance(seg, (Verbatim, Stubbed)):
            continue
        done = {s.block for s in seg.stubs} if isinstance(seg, Stubbed) else set()
        for result in inp.dialect.tool_results(work.messages[n]):
            if result.block not in done:
                candidates.append((n, result))
    # The newest results stay, and so does every result given in the same message as one.
    newest = kept(candidates, inp)
    protected = {n for n, _ in newest}
    stubs: dict[int, list[Stub]] = {}
    blobs: list[tuple[str, str]] = []
    for n, result in candidates:
        if n in protected or not stubbable(result, inp):
            continue
        text = result.text
        assert text is not None
        ref = ref_for(text)
        stubs.setdefault(n, []).append(Stub(result.block, ref, policy.stub_head_chars))
        blobs.append((ref, text))
    if not stubs or len(blobs) < batch:
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


def kept(candidates: list[tuple[int, ToolResult]], inp: PlanInput) -> list[tuple[int, ToolResult]]:
    """The newest keep_results of the results not yet stubbed (oldest first), as many of
    them as fit in keep_results_tokens (the newest whatever its size)."""
    policy = inp.policy
    newest = candidates[len(candidates) - policy.keep_results :] if policy.keep_results else []
    if policy.keep_results_tokens <= 0 or len(newest) < 2:
        return newest
    total = 0
    for n in range(len(newest) - 1, -1, -1):
        total += inp.counter.count_result(newest[n][1].content)
        if total > policy.keep_results_tokens and n < len(newest) - 1:
            return newest[n + 1 :]
    return newest


def stubbable(result: ToolResult, inp: PlanInput) -> bool:
    """Whether a result is stubbed once it leaves the keep window: text, longer than the
    stub's head, and over offload_threshold."""
    text, policy = result.text, inp.policy
    if text is None or len(text) <= policy.stub_head_chars:
        return False
    return result_exceeds(result.content, policy.offload_threshold, inp.counter)


def result_exceeds(content: object, limit: int, counter: MessageCounter) -> bool:
    """Whether a tool result's count (`counter.count_result(content)`) exceeds `limit`,
    decided from its text's bytes when bounds suffice: every token is at least one byte
    of the text, and (tiktoken's words never span whitespace; the byte estimate counts a
    token per 4 bytes) at least min(its words, a quarter of its bytes) tokens."""
    if isinstance(content, str):
        data = content.encode("utf-8", "surrogatepass")
        if RESULT_FRAMING + len(data) <= limit:
            return False
        need = limit - RESULT_FRAMING  # tokens past it exceed the limit
        if need < 0 or (len(data) // 4 > need and _words_exceed(data, need)):
            return True
    return counter.count_result(content) > limit


def _words_exceed(data: bytes, count: int) -> bool:
    """Whether `data` holds more than `count` words (`bytes.split`'s), split no further than
    that: a 20 KB result holds thousands, and a limit of a few hundred decides."""
    return len(data.split(None, count)) > count


def breakpoint_at(
    work: Working, inp: PlanInput, limits: Limits | None = None
) -> tuple[int | None, bool]:
    """Where the proxy's cache breakpoint goes: the last message the next offload step
    leaves as it is, the one before the oldest result still whole that will be stubbed
    as it ages. The next request then reads all before that result from the cache and
    writes from its stub on; a breakpoint at the end of the stubbed region would have it
    write the turn between again, once per turn. With no such result, the end of the
    stubbed region (None: nothing stubbed, no breakpoint of the proxy's).

    And whether what follows it goes uncached (`Rewrite.uncached_tail`): it is the newest
    result, whole, and the next request stubs it. So when one result stays whole
    (keep_results 1), each is stubbed as it ages (no batches), and the next request,
    adding a turn the size of the one after the breakpoint, would be past the offload
    trigger (it then takes an offload step) and not past where summaries are made ahead
    (they read their prefix from the cache). Written to the cache it would cost 1.25 a
    token and never be read whole; sent uncached, 1.0. Should the next request not stub
    it after all (a smaller turn, a turn without a tool result, an edited history), it
    is written then: 0.9 a token more than a read, once. `limits` None (a fold, a pack):
    never."""
    last = last_stub(work.segments)
    if last is None:
        return None, False
    for n in range(last + 1, len(work.segments)):
        seg = work.segments[n]
        if not isinstance(seg, Verbatim):
            continue
        if any(stubbable(r, inp) for r in inp.dialect.tool_results(work.messages[n])):
            batch = inp.policy.offload_batch or inp.dialect.offload_batch
            one = inp.policy.keep_results <= 1 and batch == 1
            if limits is None or not one:
                return n - 1, False
            after = work.tokens + sum(shape.tokens for shape in work.shapes[n:])
            return n - 1, limits.offload_at < after <= limits.prepare_at
    return last, False


def fold(need: FoldPlan, text: str | None, *, summary: str) -> Rewrite | Refuse:
    """Complete a crossing with the summary (None: there is none, so pack instead);
    `summary` says how it was had (SUMMARY_STATES)."""
    inp, work = need.inp, need.work
    if text is None or not text.strip():
        reason = need.reason or "summary_unavailable"
        return pack(inp, work, need.limits, need.tokens_before, need.blobs, reason)
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
        return pack(inp, work, need.limits, need.tokens_before, need.blobs, need.reason)
    # Every blob is kept: the summary may name the refs of the results it folded.
    return rewrite_of(
        inp,
        done,
        inp.tool if has_stubs(segments) or inp.sticky_tool or folded_into.refs else None,
        Strategy.summarising(bool(need.blobs)),
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
        for result in inp.dialect.tool_results(message):
            text = result.text
            if text is not None and (ref := ref_for(text)) in wanted:
                found[ref] = text
    return list(found.items())


def pack(
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
        return refuse(inp, work, limits)
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
    strategy = Strategy.packing(bool(blobs))
    if done.tokens > limits.trigger:
        reason = reason or "target_unreachable"
    tool = inp.tool if kept or inp.sticky_tool or vouched_refs(segments) else None
    return rewrite_of(inp, done, tool, strategy, before, blobs=blobs, reason=reason)


def refuse(inp: PlanInput, work: Working, limits: Limits) -> Refuse:
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


def rewrite_of(
    inp: PlanInput,
    work: Working,
    tool: str | None,
    strategy: Strategy,
    before: int,
    *,
    blobs: list[tuple[str, str]] | None = None,
    checkpoint: bool = True,
    summary: str = "",
    summary_key: str | None = None,
    reason: str = "",
    limits: Limits | None = None,
) -> Rewrite:
    """The outcome of a step; `limits` (an offload step's or a checkpoint's under the
    trigger): whether the newest result may go uncached (`breakpoint_at`)."""
    stored = None
    if checkpoint:
        # The rewrite frozen over the whole prefix this request sent.
        stored = Checkpoint(
            covers=len(inp.digests),
            prefix_hash=chain_hash(inp.digests),
            segments=tuple(work.segments),
            tool=tool,
            strategy=strategy,
            summary_key=summary_key,
            tokens_after=work.tokens,
        )
    if not summary and any(isinstance(seg, Summary) for seg in work.segments):
        summary = "reused"  # the history sent holds a summary made at an earlier crossing
    if inp.tool is None and reason == "" and strategy.crossing:
        reason = "offload_off"
    # (before the refs: core/segments.py is read once)
    at, uncached_tail = breakpoint_at(work, inp, limits)
    return Rewrite(
        messages=work.messages,
        tool=tool,
        strategy=strategy,
        tokens_before=before,
        tokens_after=real(work.tokens, inp.factor),
        estimate=work.tokens,
        blobs=blobs or [],
        checkpoint=stored,
        refs=vouched_refs(work.segments),  # every ref the history may read
        breakpoint_at=at,
        uncached_tail=uncached_tail,
        summary=summary,
        reason=reason,
    )
