"""What the planner remembers between requests: the stubbed messages it built.

A checkpoint's stubs are reapplied to every later request of the conversation, so the
same stubbed message would be built and counted again on every turn; the shell keeps
one memo for all requests (`PlanInput.stubbed`), keyed by what the message is built from
(`segments.stubbed_key`), bounded by STUBBED_MEMO_SIZE.
"""

from __future__ import annotations

from typing import Any

from proxy.core.plan_input import PlanInput
from proxy.core.segments import REBUILDABLE_FORMS, Stubbed, material, stubbed_key


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
