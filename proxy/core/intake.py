"""The pure steps around the planner, as the server and the ops simulator both take them.

Before planning: count the request (`count_request`), check it against the trigger and
the window (`Counted.fits`, or `cannot_cross` from the body's size alone), then, once
the caller has the conversation's checkpoint for `checkpoint_slot`, build the planner's
input (`plan_input`). After planning: the fields a `Rewrite` replaces in the body
(`replaced_fields`). What is I/O (the store, the summariser, metrics) and what is kept in
memory for a simulation stays with the callers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.checkpoint import message_digest
from proxy.core.policy import Policy
from proxy.core.rewrite import PlanInput, Rewrite
from proxy.wire.formats import Format

# Estimated tokens a body can hold beyond one per byte (the tools preamble and such).
BYTE_BOUND_SLACK = 1024


def cannot_cross(body: bytes, policy: Policy, factor: float) -> bool:
    """Whether the body's size alone proves it is under the trigger and the window.

    Every estimated token of text stands for at least one byte of the JSON body, and the
    fixed overheads (per message, per block) are smaller than the JSON around them; only
    the tools preamble needs slack. Images and documents are the exception (a small PDF
    is charged per page, a URL image a flat amount), so a body with a `source` is counted.
    """
    if b'"source"' in body:
        return False
    bound = (len(body) + BYTE_BOUND_SLACK) * factor
    return bound <= policy.trigger_tokens and bound <= policy.window


@dataclass(frozen=True, slots=True)
class Counted:
    fixed: int  # system prompt + tools, estimated
    counts: list[int]  # each message, estimated

    @property
    def history(self) -> int:
        return sum(self.counts)

    def fits(self, policy: Policy, factor: float) -> bool:
        """Under the window and the trigger, calibrated: nothing to plan."""
        history = self.history
        return (history + self.fixed) * factor <= policy.window and (
            history * factor <= policy.trigger_tokens
        )


def count_request(
    fmt: Format, counter: Any, body: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]
) -> Counted:
    """`counter` is the format's (`fmt.counter(base)`)."""
    return Counted(fmt.fixed_tokens(counter, body), [counter.count_message(m) for m in messages])


def digests_of(messages: Sequence[Mapping[str, Any]]) -> list[bytes]:
    return [message_digest(m) for m in messages]


def checkpoint_slot(digests: Sequence[bytes]) -> str:
    """One checkpoint per first message: agents that share a session id between their
    sub-agents (Claude Code does) keep one frozen prefix each."""
    return digests[0].hex()[:16]


@dataclass(frozen=True, slots=True)
class Planning:
    inp: PlanInput
    tool_tokens: int  # read_result's definition, estimated (0 when offload is off)

    def fixed_sent(self, rewrite: Rewrite) -> int:
        """System prompt and tools as sent: read_result's definition when injected."""
        return self.inp.fixed_tokens + (self.tool_tokens if rewrite.tool else 0)


def plan_input(
    fmt: Format,
    counter: Any,
    body: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]],
    counted: Counted,
    digests: Sequence[bytes],
    *,
    policy: Policy,
    factor: float,
    checkpoint: Mapping[str, Any] | None,
    store_ok: bool,
) -> Planning:
    """The planner's input for a request that does not fit (or has a checkpoint)."""
    tool = fmt.tool_name(body)
    tools = body.get("tools")
    tool_list = tools if isinstance(tools, list) else []
    tool_tokens = 0
    if tool:
        injected = fmt.dialect.read_result_tool(tool)
        tool_tokens = counter.count_tools([*tool_list, injected]) - counter.count_tools(tool_list)
    inp = PlanInput(
        messages=messages,
        digests=digests,
        checkpoint=checkpoint,
        policy=policy,
        counter=counter,
        fixed_tokens=counted.fixed,
        tool_tokens=tool_tokens,
        tool=tool,
        factor=factor,
        store_ok=store_ok,
        counts=counted.counts,
        dialect=fmt.dialect,
    )
    return Planning(inp, tool_tokens)


def replaced_fields(fmt: Format, body: Mapping[str, Any], rewrite: Rewrite) -> dict[str, Any]:
    """The top-level fields of the body to send that differ from the client's: the
    rewritten messages, and the tools with read_result appended when it is injected."""
    replace: dict[str, Any] = {"messages": rewrite.messages}
    if rewrite.tool:
        tools = body.get("tools")
        replace["tools"] = [
            *(tools if isinstance(tools, list) else []),
            fmt.dialect.read_result_tool(rewrite.tool),
        ]
    return replace
