"""What goes upstream for one request (`Prepared`), and how the compaction driver's
decision becomes it: refused (the API's own error), left as it came (the client's
bytes), or rewritten (its body, the headers telling the client what was done, and the
read rounds its answer may take). The record and the trace say the same."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import field, replace
from typing import Any, assert_never

from proxy import tracing
from proxy.core.driver import Decision
from proxy.core.errors import ContextTooLong, ProxyError
from proxy.core.outcome import Refuse, Rewrite, Untouched
from proxy.core.per_request import per_request
from proxy.core.policy import Policy
from proxy.core.rounds import RoundsRequest
from proxy.core.tokens import TokenCounter
from proxy.core.wire_format import WireFormat
from proxy.server.record import RequestRecord

log = logging.getLogger(__name__)


@per_request
class Prepared:
    """What goes upstream for one request, and what the rest of its exchange needs."""

    body: bytes  # the bytes to send
    sent: Mapping[str, Any] | None  # ... parsed (the client's payload when untouched)
    model: str = ""
    estimate: int = 0  # estimated input tokens of what is sent (0: not counted)
    headers: tuple[tuple[str, str], ...] = ()  # x-compaction-* for the client
    refusal: ProxyError | None = None  # answer with this, send nothing
    tool: str | None = None  # read_result was injected under this name
    rounds: RoundsRequest | None = None  # ... and its answer's read rounds start from this
    tenant: str = ""  # calibration and budgets are kept for it; its store's keys
    conversation: str = ""  # the conversation, when compaction identified it
    policy: Policy = field(default_factory=Policy)
    sample: bool = False  # feed calibration with the first round's usage
    # Calibration (real / estimated), looked up once for the request and carried to its
    # budget reservation and its read rounds (1.0 for a body never read).
    factor: float = 1.0


def decided(
    prepared: Prepared,
    decision: Decision,
    wire: WireFormat,
    counter: TokenCounter,
    record: RequestRecord,
) -> Prepared:
    """What the driver decided for `prepared` (the request as it came): refused, left
    as it came, or rewritten; the record and the client's headers say what was done."""
    if decision.summary_failure:
        log.info("no summary (%s); packing instead", decision.summary_failure)
    if decision.declined:
        log.warning("compaction declined: %s", redacted(decision.declined))
    outcome = decision.outcome
    match outcome:
        case Refuse():
            record.refused, record.reason = True, outcome.reason
            return replace(prepared, refusal=ContextTooLong(outcome.message))
        case Untouched():
            if not outcome.reason:
                return prepared
            # Over the trigger, its summary still being made ahead.
            record.reason = outcome.reason
            return replace(prepared, headers=(("x-compaction-reason", outcome.reason),))
        case Rewrite():
            assert decision.body is not None and decision.sent is not None
            _recorded(outcome, prepared.policy, record)
            rounds = None
            if outcome.tool is not None:
                rounds = RoundsRequest(
                    wire,
                    decision.sent,
                    decision.body,
                    frozenset(outcome.refs),
                    counter,
                    prepared.policy,
                    prepared.factor,
                    relist=outcome.tool if decision.relists else None,
                )
            return replace(
                prepared,
                body=decision.body,
                sent=decision.sent,
                headers=_told(outcome),
                tool=outcome.tool,
                rounds=rounds,
            )
        case _:
            assert_never(outcome)


# A quoted value of the client's in an API's rule ('...', `...`): ids and roles are kept
# for the operator, anything longer than one is left out (no prompt text in the log).
_QUOTED = re.compile(r"'[^']{65,}'|`[^`]{65,}`")


def redacted(rule: str) -> str:
    """The rule a request broke, as logged: long quoted values left out, cut short."""
    return _QUOTED.sub("'...'", rule)[:300]


def _recorded(rewrite: Rewrite, policy: Policy, record: RequestRecord) -> None:
    """Say what a rewrite did: on the record and in a trace event."""
    strategy = rewrite.strategy
    record.strategy = strategy
    record.reason = rewrite.reason
    record.tokens_before, record.tokens_after = rewrite.tokens_before, rewrite.tokens_after
    record.offloaded = len(rewrite.blobs)
    record.summary = rewrite.summary if strategy.crossing else ""
    if strategy.folded:
        tracing.event(
            "compaction.fold" if strategy.summarised else "compaction.pack",
            {
                "compaction.strategy": strategy.value,
                "compaction.tokens_before": rewrite.tokens_before,
                "compaction.tokens_after": rewrite.tokens_after,
                "compaction.summary": rewrite.summary or "none",
                "compaction.reason": rewrite.reason or "none",
            },
        )
    if strategy.crossing and rewrite.tokens_after > policy.trigger_tokens:
        log.warning(
            "history still %d tokens after compaction, above the trigger %d (%s)",
            rewrite.tokens_after,
            policy.trigger_tokens,
            rewrite.reason or "target_unreachable",
        )


def _told(rewrite: Rewrite) -> tuple[tuple[str, str], ...]:
    """What the client's headers say of a rewrite."""
    headers = [
        ("x-compaction-strategy", rewrite.strategy.value),
        ("x-compaction-tokens-before", str(rewrite.tokens_before)),
        ("x-compaction-tokens-after", str(rewrite.tokens_after)),
        ("x-compaction-offloaded", str(len(rewrite.refs))),
        ("x-compaction-summary", rewrite.summary or "none"),
    ]
    if rewrite.reason:
        headers.append(("x-compaction-reason", rewrite.reason))
    return tuple(headers)
