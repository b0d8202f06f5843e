"""The proxy's decisions for saved requests, without calling anything.

`Simulator.step(body)` does what the Compactor does for one request of its format
(Anthropic Messages unless given): the same pure steps (proxy/core/intake.py: count,
trigger check, checkpoint slot, the planner's input, the body to send) around the pure
planner, with the effects kept in memory: the conversation's checkpoints (one per first
message), the stored summaries (a placeholder text of the slot's size stands in for the
summariser's answer), the offloaded blobs. Steps on one Simulator form one conversation,
as the replica fleet would see it. Calibration is fixed (factor 1.0 unless given, no
sampling): the local count is taken as the real one, and every request is counted (the
Compactor's byte-size shortcut only skips counts that could not change the decision).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.core.dialect import Dialect
from proxy.core.intake import (
    Planning,
    checkpoint_slot,
    count_request,
    digests_of,
    plan_input,
    replaced_fields,
)
from proxy.core.offload import ref_for, result_text
from proxy.core.policy import Policy, policy_for
from proxy.core.rewrite import (
    NeedSummary,
    Refuse,
    Rewrite,
    Untouched,
    finish_with_summary,
    plan_request,
)
from proxy.core.summary import INSTRUCTION
from proxy.core.tokens import TokenCounter
from proxy.wire.anthropic import request_messages
from proxy.wire.formats import ANTHROPIC_FORMAT, Format


@dataclass(frozen=True, slots=True)
class Offloaded:
    ref: str
    tool: str  # the name of the tool whose result it was
    tokens: int


@dataclass(frozen=True, slots=True)
class Summarise:
    """A summary the step needed: made (a summariser call) or reused from the store."""

    messages: int  # client messages folded into it
    slot: int  # the output cap, tokens
    reused: bool
    input_tokens: int  # the summariser call's prompt (instruction + transcript)


@dataclass(slots=True)
class Step:
    body: dict[str, Any]  # what would go upstream
    policy: Policy
    kind: str  # "untouched", "rewrite" or "refuse"
    strategy: str = ""  # the rewrite's strategy ("checkpoint": a frozen one reapplied)
    tokens_before: int = 0  # history, as the client sent it
    tokens_after: int = 0  # history, as sent
    fixed_tokens: int = 0  # system prompt and tools (read_result's definition included)
    offloaded: list[Offloaded] = field(default_factory=list)  # newly offloaded results
    stubs: int = 0  # offloaded results in the history sent (new and earlier)
    folded: int = 0  # client messages behind the summary
    dropped: int = 0  # client messages behind a drop note
    summary: Summarise | None = None
    pack_fallback: Rewrite | Refuse | None = None  # what a failed summariser would give
    refusal: str = ""


def placeholder_summary(slot: int, key: str) -> str:
    """Text of about `slot` tokens (one per word) standing in for a real summary."""
    words = max(1, slot - 12)
    return f"[placeholder summary {key[:12]}] " + "note " * words


def _tool_names(messages: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """call id -> tool name: Anthropic tool_use blocks and Chat tool_calls."""
    names = {}
    for m in messages:
        calls = m.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict):
                function = call.get("function")
                name = function.get("name", "?") if isinstance(function, dict) else "?"
                names[str(call.get("id"))] = str(name)
        content = m.get("content")
        for b in content if isinstance(content, list) else []:
            if isinstance(b, dict) and b.get("type") == "tool_use":
                names[str(b.get("id"))] = str(b.get("name", "?"))
    return names


def _result_owners(messages: Sequence[Mapping[str, Any]], dialect: Dialect) -> dict[str, str]:
    """ref -> tool name, for every tool result in the history (the results as the
    format's dialect finds them: tool_result blocks, or Chat `tool` messages)."""
    names = _tool_names(messages)
    owners = {}
    for m in messages:
        for _, block in dialect.tool_results(m):
            text = result_text(block)
            if text is not None:
                call_id = block.get("tool_use_id", m.get("tool_call_id"))
                owners[ref_for(text)] = names.get(str(call_id), "?")
    return owners


class Simulator:
    def __init__(
        self,
        policies: Sequence[Policy],
        counter: TokenCounter,
        *,
        factor: float = 1.0,
        fmt: Format = ANTHROPIC_FORMAT,
    ) -> None:
        self.policies = list(policies)
        self.counter = counter
        self.factor = factor
        self.format = fmt
        self.checkpoints: dict[str, dict[str, Any]] = {}  # slot -> checkpoint, as stored
        self.summaries: dict[str, str] = {}  # key -> text, as the store would keep them
        self.blobs: dict[str, int] = {}  # ref -> length in characters

    def step(self, body: dict[str, Any]) -> Step:
        fmt = self.format
        counter = fmt.counter(self.counter)
        messages = request_messages(body)
        model = str(body.get("model", ""))
        policy = policy_for(model, self.policies)
        counted = count_request(fmt, counter, body, messages)
        history, fixed = counted.history, counted.fixed
        if not messages or counted.fits(policy, self.factor):
            return Step(body, policy, "untouched", tokens_before=history, tokens_after=history,
                        fixed_tokens=fixed)  # fmt: skip
        digests = digests_of(messages)
        slot = checkpoint_slot(digests)
        planning = plan_input(
            fmt,
            counter,
            body,
            messages,
            counted,
            digests,
            policy=policy,
            factor=self.factor,
            checkpoint=self.checkpoints.get(slot),
            store_ok=True,
        )
        outcome = plan_request(planning.inp)
        summary: Summarise | None = None
        fallback: Rewrite | Refuse | None = None
        if isinstance(outcome, NeedSummary):
            need = outcome
            stored = self.summaries.get(need.key)
            text = stored or placeholder_summary(need.slot, need.key)
            base = self.counter
            prompt = base.count_text(INSTRUCTION) + base.count_text(need.transcript)
            fallback = finish_with_summary(need, None, reused=False)
            outcome = finish_with_summary(need, text, reused=stored is not None)
            if isinstance(outcome, Rewrite) and outcome.summary:
                self.summaries[need.key] = text
                summary = Summarise(0, need.slot, stored is not None, prompt)
        if isinstance(outcome, Untouched):
            return Step(body, policy, "untouched", tokens_before=history, tokens_after=history,
                        fixed_tokens=fixed)  # fmt: skip
        if isinstance(outcome, Refuse):
            return Step(body, policy, "refuse", tokens_before=history, fixed_tokens=fixed,
                        refusal=outcome.message)  # fmt: skip
        return self._rewritten(body, outcome, policy, slot, planning, summary, fallback)

    def _rewritten(
        self,
        body: dict[str, Any],
        rewrite: Rewrite,
        policy: Policy,
        slot: str,
        planning: Planning,
        summary: Summarise | None,
        fallback: Rewrite | Refuse | None,
    ) -> Step:
        if rewrite.checkpoint is not None:
            self.checkpoints[slot] = rewrite.checkpoint
        checkpoint = self.checkpoints.get(slot) or {}
        segments = checkpoint.get("segments") or []
        kept = sum(1 for s in segments if s[0] in ("m", "s"))
        folded = sum(int(s[2]) for s in segments if s[0] == "summary")
        total = int(checkpoint.get("n", 0))
        owners = _result_owners(request_messages(body), self.format.dialect)
        offloaded = []
        for ref, text in rewrite.blobs:
            self.blobs[ref] = len(text)
            offloaded.append(Offloaded(ref, owners.get(ref, "?"), self.counter.count_text(text)))
        if summary is not None:
            summary = Summarise(folded, summary.slot, summary.reused, summary.input_tokens)
        replace = replaced_fields(self.format, body, rewrite)
        return Step(
            {**body, **replace},
            policy,
            "rewrite",
            strategy=rewrite.strategy,
            tokens_before=rewrite.tokens_before,
            tokens_after=rewrite.tokens_after,
            fixed_tokens=planning.fixed_sent(rewrite),
            offloaded=offloaded,
            stubs=len(rewrite.refs),
            folded=folded,
            dropped=max(0, total - kept - folded),
            summary=summary,
            pack_fallback=fallback,
        )
