"""What the summariser reads: its input assembled for a fold, or for a whole history.

A fold's summary is asked one of two ways (`FoldPlan`): in place, the conversation's own
request with a last message naming the messages to replace and the originals of the
results offloaded among them (its prefix read from the prompt cache: `in_place`), or a
request of its own holding a transcript of the folded turns as the client sent them, cut
to the summariser's window (`transcript`). The identifiers the summary must keep are
gathered from the same turns (`facts`), and the summary is stored under a key of exactly
what its call sees (`summary_key`, `seen_key`). `whole_summary` makes the same choice for
a summary of a whole history as sent (a compaction the proxy serves), kept under
`whole_key`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.digests import chain_hash, message_digest
from proxy.core.facts import (
    CONVERSATION,
    EARLIER_SUMMARY,
    TOOL_RESULT,
    Facts,
    Source,
    identifiers,
)
from proxy.core.outcome import FoldPlan, InPlace
from proxy.core.policy import Policy
from proxy.core.segments import (
    Segment,
    Stubbed,
    Verbatim,
    has_stubs,
    last_stub,
    made_here,
    vouched_refs,
)
from proxy.core.summary import INSTRUCTION, in_place_prompt
from proxy.core.working import Limits, PlanInput, Working, real

Message = Mapping[str, Any]


def folding(
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
    summary_tokens = min(
        real(room, inp.factor), inp.policy.summary_max_tokens, _to_carry(work, members, inp)
    )
    facts_budget = min(FACTS_MAX, max(FACTS_MIN, summary_tokens // 5))
    folds = summary_key(work.segments, members, inp.digests)
    return FoldPlan(
        key=seen_key(folds, inp.digests),
        folds=folds,
        transcript=_transcript(work, members, inp, summary_tokens),
        in_place=_in_place(work, members, inp, summary_tokens),
        summary_tokens=max(summary_tokens - facts_budget, summary_tokens // 2, MIN_SUMMARY_TOKENS),
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


def _to_carry(work: Working, members: Sequence[int], inp: PlanInput) -> int:
    """The summary's cap by what it must carry, in real tokens: an earlier summary it
    folds, whole (what that one carried goes on), and SUMMARY_SHARE of the folded turns as
    the client sent them (their results whole: what the summariser is shown of them);
    at least SUMMARY_FLOOR. (The policy's summary_max_tokens and the fold's room bound it.)"""
    earlier = sum(work.shapes[m].tokens for m in members if made_here(work.segments[m]))
    sent = sum(
        inp.counts[seg.index]
        for seg in (work.segments[m] for m in members)
        if isinstance(seg, (Verbatim, Stubbed))
    )
    carried = real(earlier, inp.factor) + math.ceil(SUMMARY_SHARE * real(sent, inp.factor))
    return max(SUMMARY_FLOOR, carried)


# A summary's cap when its fold is small (`_to_carry`): a share of what it folds, and at
# least a floor in tokens; a fold of 80,000 tokens or more as the client sent them
# (results whole), or one that carries an earlier summary, gets the policy's cap.
SUMMARY_SHARE, SUMMARY_FLOOR = 0.05, 1_000

# The line of identifiers a summary left out (proxy/core/facts.py) may take a fifth of the
# summary's cap, at least FACTS_MIN and at most FACTS_MAX tokens; the summariser keeps at
# least half of its cap (a small cap may so end a little over the target).
FACTS_MIN, FACTS_MAX = 200, 1_500
# The least output cap a summariser call asks for, whatever little room its fold has: the
# least every API takes (the Responses API refuses a max_output_tokens below 16, and
# Messages one below 1, or not above a thinking budget). A fold with less room ends that
# much over its target, like the half kept above.
MIN_SUMMARY_TOKENS = 16
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
    summary_tokens: int = 0  # the summary's cap, real tokens (the policy's summary_max_tokens)

    def transcript_budget(self, instruction: int) -> int:
        """Tokens the transcript may take: the room less the summary's cap and the
        instruction's words (`instruction`, counted)."""
        return self.room - self.summary_tokens - instruction


def whole_summary(
    policy: Policy, factor: float, model: str, history_tokens: Callable[[], int]
) -> WholeSummary:
    """In place when the summariser is the conversation's model and the history
    (`history_tokens`, counted only then), the prompt's words and the summary's cap fit
    its window; else a transcript, by the policy's summariser."""
    room = summariser_room(policy, factor)
    if policy.summariser_model in ("", model):
        used = history_tokens() + IN_PLACE_OVERHEAD
        if used + policy.summary_max_tokens <= room:
            return WholeSummary(model, room, used, policy.summary_max_tokens)
    return WholeSummary(policy.summariser_model or model, room, 0, policy.summary_max_tokens)


def whole_key(messages: Sequence[Message]) -> str:
    """Where the summary of a whole history as sent is stored: the hash of its messages,
    all of which its call sees."""
    return chain_hash([message_digest(m) for m in messages])


def summary_key(
    segments: Sequence[Segment], members: Sequence[int], digests: Sequence[bytes]
) -> str:
    """Where the summary of these folded segments is stored: a hash of the turns as the
    client sent them (and of an earlier summary's text), so the same turns give the same
    key whether or not some of their results were offloaded."""
    return chain_hash(member_digests(segments, members, digests))


def member_digests(
    segments: Sequence[Segment], members: Sequence[int], digests: Sequence[bytes]
) -> list[bytes]:
    """What `summary_key` hashes of each folded segment, in order."""
    return [
        digests[seg.index]
        if isinstance(seg, (Verbatim, Stubbed))
        else message_digest({"proxy": seg.text})
        for seg in (segments[m] for m in members)
    ]


def seen_key(folds: str, digests: Sequence[bytes]) -> str:
    """Where the summary of the turns `folds` made from a history of these messages is
    stored: made in place, its summariser reads the whole history (the newest turn
    included), so a line that shares only the folded turns must never find it."""
    return chain_hash([bytes.fromhex(folds), bytes.fromhex(chain_hash(digests))])


def _in_place(
    work: Working, members: Sequence[int], inp: PlanInput, summary_tokens: int
) -> InPlace:
    """The conversation's history as it would go without the fold, and a last message
    naming the messages to replace, with the originals of the results offloaded among
    them (the summariser reads what the stubs hide): whole up to ORIGINALS_WHOLE_TOKENS;
    past that the longest by their lines that hold an identifier (`identifier_lines`);
    past ORIGINALS_TOKENS and what the window leaves, the longest cut first."""
    pieces: list[str] = []
    tokens: list[int] = []
    for m in members:
        seg = work.segments[m]
        if isinstance(seg, Stubbed):
            original = inp.dialect.render_transcript([inp.messages[seg.index]])
            pieces.append(f"[{', '.join(seg.refs)}]\n{original}")
            tokens.append(inp.counts[seg.index])
    identifier_lines(pieces, tokens, ORIGINALS_WHOLE_TOKENS)
    # The originals are plain text, which counts about as estimated: a factor below 1
    # (learnt on requests whose sealed content the estimate overcounts) must not let them
    # grow, so the window is taken in real tokens then (this is never over limits.limit).
    factor = max(1.0, inp.factor)
    limit = math.floor(inp.policy.window / factor) - inp.fixed_tokens - inp.tool_tokens
    room = limit - work.tokens - math.ceil(summary_tokens / factor) - IN_PLACE_OVERHEAD
    # The originals are cut by their messages' counts, not their rendered text's: keep
    # SUMMARISER_MARGIN of the window free for the difference.
    budget = min(room - math.ceil(inp.policy.window * SUMMARISER_MARGIN / factor), ORIGINALS_TOKENS)
    # Each piece keeps a head and a tail when cut: past what the budget holds of those,
    # the newest pieces only.
    fit = max(budget, 0) // MIN_PIECE_TOKENS
    originals = _fitted(pieces[-fit:], tokens[-fit:], budget) if fit else ""
    first, last = members[0], members[-1]
    heads = (
        inp.dialect.head_text(work.messages[first]),
        inp.dialect.head_text(work.messages[last]),
    )
    prompt = in_place_prompt(first + 1, last + 1, heads, originals)
    return InPlace(
        work.messages, last_stub(work.segments), prompt, fits=room >= 0, tool=_tool_of(work, inp)
    )


def identifier_lines(pieces: list[str], tokens: list[int], whole: int) -> None:
    """While the pieces' tokens are over `whole`, the longest piece left is replaced by
    its lines that hold an identifier (proxy/core/facts.py: paths, ports, versions,
    names of a rare shape; its ref's line among them), its tokens by their share of its
    characters. In place."""
    total = sum(tokens)
    for k in sorted(range(len(pieces)), key=lambda n: -tokens[n]):
        if total <= whole:
            return
        text = pieces[k]
        kept = "\n".join(line for line in text.split("\n") if identifiers(line))
        share = math.ceil(tokens[k] * len(kept) / max(len(text), 1))
        total -= tokens[k] - share
        pieces[k], tokens[k] = kept, share


def _tool_of(work: Working, inp: PlanInput) -> str | None:
    """The name read_result is injected under in the request `work` would make."""
    named = has_stubs(work.segments) or inp.sticky_tool or vouched_refs(work.segments)
    return inp.tool if named else None


IN_PLACE_OVERHEAD = 600  # tokens of the in-place prompt's own words, with a margin
# How much of the folded turns' offloaded results the in-place call shows whole (tokens).
# They follow the cached prefix, so they are paid at the full input price, once per fold
# (at most ORIGINALS_TOKENS input units, about ten turns of a 60,000-token history read
# from the cache); a fact the summary could not see is lost for the rest of the session.
# Sized for real sessions: a fold at the trigger of 100,000 took about 40 turns of
# bench/facts.py's results session (results of 1,000 to 24,000 characters), whose
# originals came to about 57,000 tokens (at the default 60,000 / 30,000 about 32,000 a
# fold); seven of Claude Code's ~8,600-token reads.
ORIGINALS_TOKENS = 60_000
# Past this many tokens of originals in one fold, the longest are shown by their lines
# that hold an identifier: a summary of at most summary_max_tokens carries little more of
# them than that, and the originals are what a fold pays at the full price. On the
# results session of bench/facts.py (about 32,000 tokens of originals a fold) 0.511x-
# 0.512x -> 0.486x-0.489x of the unmanaged cost, 30 of 30 facts either way (bench/
# RESULTS.md, issue 35); a fold of a few results still sees them whole.
ORIGINALS_WHOLE_TOKENS = 20_000
MIN_PIECE_TOKENS = 150  # what a piece cut to its head and tail still takes, about


def _original(seg: Segment, work: Working, m: int, inp: PlanInput) -> Message:
    """What the summariser reads for a folded segment: the client's message itself (its
    results whole, never stubs), or the summary or note the proxy wrote."""
    if isinstance(seg, (Verbatim, Stubbed)):
        return inp.messages[seg.index]
    return work.messages[m]


def _transcript(work: Working, members: Sequence[int], inp: PlanInput, summary_tokens: int) -> str:
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
    budget = window - math.ceil(summary_tokens / factor) - inp.counter.count_text(INSTRUCTION)
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
