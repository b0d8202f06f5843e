"""Grouping a history and mapping it onto the two planners."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from proxy.core.history import (
    ORDINARY_ROLES,
    Group,
    GroupKind,
    Shape,
    _pin_current_turn,
    compaction_turns,
    group_history,
    pack_messages,
    pinned_tokens,
)
from proxy.core.pack import pack_context


def U(tokens: int = 10, answers: tuple[str, ...] = ()) -> Shape:
    return Shape("user", tokens, answers=answers)


def A(tokens: int = 10, calls: tuple[str, ...] = ()) -> Shape:
    return Shape("assistant", tokens, calls=calls)


def kinds(shapes: list[Shape]) -> list[tuple[str, tuple[int, ...]]]:
    return [(g.kind.value, g.members) for g in group_history(shapes)]


def test_a_call_and_its_result_are_one_pair() -> None:
    shapes = [U(), A(calls=("a",)), U(answers=("a",)), A(calls=("b",)), U(answers=("b",))]
    assert kinds(shapes) == [("pinned", (0,)), ("pair", (1, 2)), ("pinned", (3, 4))]


def test_parallel_calls_are_one_pair() -> None:
    shapes = [U(), A(calls=("a", "b")), U(answers=("a", "b")), A(), U()]
    assert kinds(shapes) == [("single", (0,)), ("pair", (1, 2)), ("single", (3,)), ("pinned", (4,))]


def test_results_spread_over_following_messages_join_the_pair() -> None:
    # OpenAI sends one `tool` message per call.
    shapes = [
        U(),
        A(calls=("a", "b")),
        Shape("tool", 5, answers=("a",)),
        Shape("tool", 5, answers=("b",)),
        A(),
        U(),
    ]
    assert kinds(shapes)[1] == ("pair", (1, 2, 3))


def test_unanswered_call_and_orphan_result_are_malformed() -> None:
    shapes = [U(), A(calls=("a",)), U(), U(answers=("ghost",)), A(), U()]
    got = kinds(shapes)
    assert ("malformed", (1,)) in got and ("malformed", (3,)) in got


def test_partly_answered_call_is_malformed() -> None:
    shapes = [U(), A(calls=("a", "b")), U(answers=("a",)), A(), U()]
    assert kinds(shapes)[1] == ("malformed", (1, 2))


def test_system_and_unknown_roles_are_pinned() -> None:
    shapes = [Shape("system", 3), U(), Shape("developer-note", 2), A(), U()]
    got = dict((m, k) for k, m in kinds(shapes))
    assert got[(0,)] == "pinned" and got[(2,)] == "pinned"


def test_last_user_and_newest_group_are_pinned() -> None:
    shapes = [U(), A(), U(), A(calls=("a",)), U(answers=("a",)), A(calls=("b",)), U(answers=("b",))]
    got = kinds(shapes)
    assert got == [
        ("single", (0,)),
        ("single", (1,)),
        ("pinned", (2,)),
        ("pair", (3, 4)),
        ("pinned", (5, 6)),
    ]


def test_pack_messages_keep_indices_and_pin_what_history_pins() -> None:
    shapes = [
        Shape("system", 5),
        U(30),
        A(3),
        U(11),
        A(2, calls=("a",)),
        U(40, answers=("a",)),
        A(4),
    ]
    groups = group_history(shapes)
    packed = pack_messages(groups, shapes)
    assert [m[1] for m in packed] == [s.tokens for s in shapes]
    assert [m[0] for m in packed] == [
        "system",
        "assistant",
        "assistant",
        "system",
        "call",
        "result",
        "system",
    ]
    pinned, note = 5 + 11 + 4, 10
    # Room for the pair but not the older single: the walk stops there.
    assert pack_context(packed, pinned + note + 42, note) == {"keep": [0, 3, 4, 5, 6], "note": True}
    # No room for the pair: nothing older is kept either, even the single that would fit.
    assert pack_context(packed, pinned + note + 3, note) == {"keep": [0, 3, 6], "note": True}


def test_compaction_turns_are_ordinary_groups_only() -> None:
    shapes = [Shape("system", 5), U(7), A(3), A(2, calls=("a",)), U(40, answers=("a",)), U(9)]
    groups = group_history(shapes)
    assert compaction_turns(groups) == [("m1", 7), ("m2", 3), ("m3", 42)]
    assert pinned_tokens(groups) == 5 + 9
    assert all(g.kind is not GroupKind.MALFORMED for g in groups)


def _grouped_plainly(shapes: Sequence[Shape]) -> list[Group]:
    """The grouping rules written as plainly as they read (the module's docstring): what
    group_history, written for speed, must give."""
    groups: list[Group] = []
    i = 0
    while i < len(shapes):
        members, kind = [i], GroupKind.SINGLE
        if shapes[i].made_here:
            kind = GroupKind.SUMMARY
        elif shapes[i].role not in ORDINARY_ROLES and not shapes[i].answers:
            kind = GroupKind.PINNED
        elif shapes[i].calls:
            while (
                members[-1] + 1 < len(shapes)
                and shapes[members[-1] + 1].answers
                and shapes[members[-1] + 1].role != "assistant"
            ):
                members.append(members[-1] + 1)
            answered = {a for m in members[1:] for a in shapes[m].answers}
            kind = GroupKind.PAIR if answered == set(shapes[i].calls) else GroupKind.MALFORMED
        elif shapes[i].answers:
            kind = GroupKind.MALFORMED
        groups.append(Group(kind, tuple(members), sum(shapes[m].tokens for m in members)))
        i = members[-1] + 1
    return _pin_current_turn(groups, shapes)


IDS = st.lists(st.sampled_from("abc"), max_size=2, unique=True).map(tuple)
SHAPE = st.builds(
    Shape,
    role=st.sampled_from(["user", "assistant", "system", "tool"]),
    tokens=st.integers(0, 1_000),
    calls=IDS,
    answers=IDS,
    made_here=st.booleans(),
)


@given(st.lists(SHAPE, max_size=12))
def test_the_grouping_follows_its_rules_as_plainly_written(shapes: list[Shape]) -> None:
    assert group_history(shapes) == _grouped_plainly(shapes)
