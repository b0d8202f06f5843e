"""The neutral history model: wire messages reduced to what grouping needs.

A wire adapter (proxy/wire/) turns each message into a `Shape`: its role, the tool calls
it makes, the calls it answers, and its token count. From shapes alone we find the
*groups* the API lets us keep or drop as a unit (docs/design.md#groups):

- a pair: an assistant message with tool calls plus the messages right after it that
  answer them (parallel calls are one pair);
- a single: any other ordinary message;
- pinned: system text, unknown roles, the last ordinary user message, and the newest
  group (the turn in progress: dropping it would change what is being asked);
- malformed: a call nobody answers or a result that answers no call. The API rejects
  both, so planners drop them (seed 001: they cost nothing and need no note).

Groups map onto the messages of `pack_context` and the turns of `plan_compaction`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class Shape:
    """What the planners need to know about one wire message."""

    role: str
    tokens: int
    calls: tuple[str, ...] = ()  # ids of the tool calls this message makes
    answers: tuple[str, ...] = ()  # ids of the tool calls this message answers
    made_here: bool = False  # a summary or note this proxy wrote into the history


class GroupKind(StrEnum):
    PINNED = "pinned"
    SUMMARY = "summary"  # what an earlier rewrite left: folded first, dropped first
    PAIR = "pair"
    SINGLE = "single"
    MALFORMED = "malformed"


@dataclass(frozen=True, slots=True)
class Group:
    kind: GroupKind
    members: tuple[int, ...]  # message indices, ascending
    tokens: int

    @property
    def label(self) -> str:
        """The plan_compaction label: "summary" for an earlier summary, else its first index."""
        return "summary" if self.kind is GroupKind.SUMMARY else f"m{self.members[0]}"


ORDINARY_ROLES = frozenset({"user", "assistant"})


def group_history(shapes: Sequence[Shape]) -> list[Group]:
    """Split a history into groups, oldest first, each message in exactly one group."""
    groups: list[Group] = []
    append = groups.append  # (once a request, over every message: kept lean)
    i, total = 0, len(shapes)
    while i < total:
        shape = shapes[i]
        if shape.made_here:
            append(Group(GroupKind.SUMMARY, (i,), shape.tokens))
            i += 1
        elif shape.role not in ORDINARY_ROLES and not shape.answers:
            # (a message answering calls is ordinary whatever the API calls its role:
            # Chat's `tool` messages)
            append(Group(GroupKind.PINNED, (i,), shape.tokens))
            i += 1
        elif shape.calls:
            answered: set[str] = set()
            tokens = shape.tokens
            j = i + 1
            while j < total and (answer := shapes[j]).answers and answer.role != "assistant":
                answered.update(answer.answers)
                tokens += answer.tokens
                j += 1
            complete = answered == set(shape.calls)
            kind = GroupKind.PAIR if complete else GroupKind.MALFORMED
            append(Group(kind, tuple(range(i, j)), tokens))
            i = j
        elif shape.answers:
            append(Group(GroupKind.MALFORMED, (i,), shape.tokens))  # answers no call
            i += 1
        else:
            append(Group(GroupKind.SINGLE, (i,), shape.tokens))
            i += 1
    return _pin_current_turn(groups, shapes)


def _pin_current_turn(groups: list[Group], shapes: Sequence[Shape]) -> list[Group]:
    """Pin the last ordinary user message and the newest ordinary group."""
    last_user = next(
        (
            n
            for n in range(len(groups) - 1, -1, -1)
            if groups[n].kind is GroupKind.SINGLE and shapes[groups[n].members[0]].role == "user"
        ),
        None,
    )
    newest = next(
        (
            n
            for n in range(len(groups) - 1, -1, -1)
            if groups[n].kind in (GroupKind.SINGLE, GroupKind.PAIR)
        ),
        None,
    )
    for n in {last_user, newest} - {None}:
        assert n is not None
        groups[n] = Group(GroupKind.PINNED, groups[n].members, groups[n].tokens)
    return groups


def pack_messages(groups: Sequence[Group], shapes: Sequence[Shape]) -> list[list[object]]:
    """The history as `pack_context` messages, index for index.

    Pinned groups become "system" (always kept), pairs become a "call" and its "result"s
    under the group's label, singles become "assistant" (a droppable group of one; calling
    them "user" would make pack_context pin the wrong message), and malformed pieces
    become calls or results with no partner, which pack_context always drops.
    """
    out: list[list[object]] = [[] for _ in shapes]
    for group in groups:
        for m in group.members:
            tokens = shapes[m].tokens
            if group.kind is GroupKind.PINNED:
                out[m] = ["system", tokens, ""]
            elif group.kind in (GroupKind.SINGLE, GroupKind.SUMMARY):
                out[m] = ["assistant", tokens, ""]
            elif group.kind is GroupKind.PAIR:
                role = "call" if m == group.members[0] else "result"
                out[m] = [role, tokens, group.label]
            elif shapes[m].calls:
                out[m] = ["call", tokens, f"unanswered:{m}"]
            else:
                out[m] = ["result", tokens, f"orphan:{m}"]
    return out


def compaction_turns(groups: Sequence[Group]) -> list[tuple[str, int]]:
    """The foldable groups as `plan_compaction` turns, oldest first.

    An earlier summary (or drop note) is labelled "summary"; the proxy always places it
    before every ordinary group it keeps, so it is the first turn, as seed 000 expects.
    """
    foldable = (GroupKind.SUMMARY, GroupKind.PAIR, GroupKind.SINGLE)
    return [(g.label, g.tokens) for g in groups if g.kind in foldable]


def pinned_tokens(groups: Sequence[Group]) -> int:
    return sum(g.tokens for g in groups if g.kind is GroupKind.PINNED)
