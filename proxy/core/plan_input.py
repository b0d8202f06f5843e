"""What the planner is given for one request, and the policy's numbers in its units.

Counts are local estimates; the policy's numbers are real tokens, so they are divided by
the calibration factor (real / estimated) once (`limits_of`), and all the planning
happens in estimated units; `real` turns an estimate back for what the client is told.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.checkpoint import Checkpoint
from proxy.core.commands import PreparedSummary
from proxy.core.policy import Policy, prepare_at
from proxy.core.segments import StubbedMemo
from proxy.core.wire_format import Dialect, MessageCounter

Message = Mapping[str, Any]


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


def real(estimate: int, factor: float) -> int:
    return math.ceil(estimate * factor)
