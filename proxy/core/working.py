"""A history under construction: the segments a plan makes, and the messages, shapes
and groups they stand for (built from the client's messages, the memo of stubbed
messages, and what the proxy wrote)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.core.history import Group, Shape, group_history
from proxy.core.plan_input import PlanInput
from proxy.core.segments import Segment, Stubbed, Verbatim, made_here, material
from proxy.core.stubbed_memo import stubbed_message


@dataclass(frozen=True, slots=True)
class Working:
    """A history under construction: segments and the messages they stand for."""

    segments: list[Segment]
    messages: list[dict[str, Any]]
    shapes: list[Shape]
    groups: list[Group]
    tokens: int = field(init=False)  # of all shapes: the planner asks for it often

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", sum(s.tokens for s in self.shapes))


def working(segments: list[Segment], inp: PlanInput) -> Working:
    messages = []
    shapes = []
    for seg in segments:
        if isinstance(seg, Verbatim):
            message = dict(inp.messages[seg.index])
            counted = inp.counts[seg.index]
        elif isinstance(seg, Stubbed):
            message, counted = stubbed_message(seg, inp)
        else:
            message = material(seg, inp.messages, inp.tool, inp.policy.read_length, inp.dialect)
            counted = inp.counter.count_message(message)
        messages.append(message)
        shape = inp.dialect.message_shape(message, counted)
        if made_here(seg):
            shape = Shape(shape.role, shape.tokens, made_here=True)
        shapes.append(shape)
    return Working(segments, messages, shapes, group_history(shapes))
