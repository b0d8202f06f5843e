"""`compaction-proxy plan FILE`: a dry run of the proxy on one saved request.

Shows what the proxy would do with the request under the current settings, using the
pure planner and nothing else (no store, no upstream, no summariser): untouched, or the
strategy with what it offloads, folds or drops, and the tokens before and after. A
summary is described, not made ("would summarise N messages into at most S tokens"),
and the pack fallback the proxy would use if the summariser failed is shown too. The
request is taken as the first of its conversation (no earlier checkpoint).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.core.outcome import REASONS, Refuse, Rewrite
from proxy.core.policy import Policy
from proxy.core.segments import Stubbed, Summary, Verbatim
from proxy.core.tokens import TokenCounter
from proxy.core.wire_format import WireFormat
from proxy.ops.simulate import Simulator, Step
from proxy.wire import ANTHROPIC


def _dropped(rewrite: Rewrite) -> int:
    checkpoint = rewrite.checkpoint
    if checkpoint is None:
        return 0
    segments = checkpoint.segments
    kept = sum(1 for s in segments if isinstance(s, (Verbatim, Stubbed)))
    folded = sum(s.folded for s in segments if isinstance(s, Summary))
    return max(0, checkpoint.covers - kept - folded)


def _saved(before: int, after: int) -> str:
    share = 100 * (before - after) / before if before else 0.0
    return f"{before:,} -> {after:,} tokens of history ({before - after:,} saved, {share:.0f}%)"


def render_plan(step: Step) -> str:
    p = step.policy
    lines = [
        f"policy {p.match!r}: window {p.window:,} ({p.window_source or 'policy'}), trigger"
        f" {p.trigger_tokens:,}, target {p.target_tokens:,} (history tokens; system prompt"
        " and tools apart)",
        f"history {step.tokens_before:,} tokens; system prompt and tools as sent"
        f" {step.fixed_tokens:,} tokens",
    ]
    if step.kind == "untouched":
        lines.append(
            f"untouched: {p.trigger_tokens - step.tokens_before:,} tokens under the trigger;"
            " forwarded as the same bytes"
        )
        return "\n".join(lines)
    if step.kind == "refuse":
        lines.append(f"refused (400 invalid_request_error): {step.refusal}")
        return "\n".join(lines)
    lines.append(f"strategy: {step.strategy}")
    if step.reason:
        lines.append(f"  why: {REASONS.get(step.reason, step.reason)}")
    if step.made_ahead is not None:
        lines.append(
            f"  has the next fold's summary made in the background (at most"
            f" {step.made_ahead.summary_tokens:,} tokens,"
            f" about {step.made_ahead.input_tokens:,} input"
            " tokens): no request waits for it"
        )
    if step.offloaded:
        tokens = sum(o.tokens for o in step.offloaded)
        lines.append(
            f"  offload {len(step.offloaded)} tool results ({tokens:,} tokens) to the store;"
            f" each becomes a stub of its first {p.stub_head_chars:,} characters, readable"
            " with read_result:"
        )
        for o in step.offloaded:
            lines.append(f"    {o.ref}  {o.tool:<16} {o.tokens:>9,} tokens")
    if step.summary is not None:
        model = p.summariser_model or "the request's own model"
        lines.append(
            f"  would summarise {step.summary.messages} messages into at most"
            f" {step.summary.summary_tokens:,} tokens (one summariser call to {model},"
            f" about {step.summary.input_tokens:,} input tokens), then check that it kept the"
            " folded turns' identifiers and append those it left out"
        )
    if step.dropped:
        lines.append(f"  drop the oldest {step.dropped} messages, with a note where they were")
    lines.append(f"  {_saved(step.tokens_before, step.tokens_after)}")
    if step.stubs and step.stubs != len(step.offloaded):
        lines.append(f"  {step.stubs} stubs stay in the history sent (the rest were folded)")
    fallback = step.pack_fallback
    if isinstance(fallback, Rewrite):
        lines.append(
            f"if the summariser failed: {fallback.strategy}: drop the oldest"
            f" {_dropped(fallback)} messages with a note;"
            f" {_saved(fallback.tokens_before, fallback.tokens_after)}"
        )
    elif isinstance(fallback, Refuse):
        lines.append(f"if the summariser failed: refused: {fallback.message}")
    return "\n".join(lines)


def plan_text(
    body: Mapping[str, Any],
    counter: TokenCounter,
    policies: Sequence[Policy],
    fmt: WireFormat = ANTHROPIC,
    betas: str = "",
) -> str:
    step = Simulator(policies, counter, fmt=fmt, betas=betas).step(dict(body))
    return render_plan(step)
