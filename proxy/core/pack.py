"""Pack a conversation under a token budget by dropping its oldest groups (seed 001).

A group is what the API lets us keep or drop as a unit: a tool call with every result
answering it, or any other single message. Pinned messages (every "system" message and
the last "user" message) always stay. When something must go, a note costing `note_cost`
tokens says so, and the kept groups are one unbroken run of the newest ones, so the
model never sees a hole in the middle of its history.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

PackMessage = Sequence[Any]  # [role, tokens, ref]


class PackResult(TypedDict):
    keep: list[int]
    note: bool


def pack_context(messages: Sequence[PackMessage], budget: int, note_cost: int) -> PackResult | None:
    """Return the indices to keep and whether a note is needed, or None if nothing fits."""
    roles = [str(m[0]) for m in messages]
    tokens = [int(m[1]) for m in messages]

    pinned = {i for i, role in enumerate(roles) if role == "system"}
    last_user = max((i for i, role in enumerate(roles) if role == "user"), default=None)
    if last_user is not None:
        pinned.add(last_user)

    groups = _groups(messages, pinned)
    pinned_cost = sum(tokens[i] for i in pinned)
    groups_cost = sum(tokens[i] for group in groups for i in group)

    if pinned_cost + groups_cost <= budget:
        kept = set(pinned).union(*groups)
        return {"keep": sorted(kept), "note": False}
    if pinned_cost + note_cost > budget:
        return None

    room = budget - pinned_cost - note_cost
    kept = set(pinned)
    for group in sorted(groups, key=min, reverse=True):  # newest first
        cost = sum(tokens[i] for i in group)
        if cost > room:
            break  # no older group is kept, so the kept history has no holes
        kept.update(group)
        room -= cost
    return {"keep": sorted(kept), "note": True}


def _groups(messages: Sequence[PackMessage], pinned: set[int]) -> list[list[int]]:
    """Every droppable group as a list of indices; malformed calls and results are left out."""
    calls: dict[str, int] = {}
    results: dict[str, list[int]] = {}
    singles: list[list[int]] = []
    for i, message in enumerate(messages):
        role, ref = str(message[0]), str(message[2])
        if role == "call":
            calls[ref] = i
        elif role == "result":
            results.setdefault(ref, []).append(i)
        elif i not in pinned:
            singles.append([i])
    pairs = [[calls[ref], *found] for ref, found in results.items() if ref in calls]
    return singles + pairs
