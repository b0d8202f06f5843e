"""Lines of a conversation (proxy/core/lines.py): several checkpoints per first message,
the longest match taken, the least recently used evicted beyond the bound; summaries
made ahead used only by a history that begins with what their call saw."""

from __future__ import annotations

from typing import Any

from proxy.core.checkpoint import Checkpoint, Line
from proxy.core.commands import PreparedSummary
from proxy.core.digests import chain_hash, message_digest
from proxy.core.lines import best_line, best_note, evicted, evicted_notes, next_tick
from proxy.core.tokens import TokenCounter
from proxy.ops.simulate import Simulator
from tests.core.test_planner import conversation, policy


def digests(*texts: str) -> list[bytes]:
    return [message_digest({"role": "user", "content": t}) for t in texts]


def line(ds: list[bytes], used: int) -> Line:
    return Line(Checkpoint(len(ds), chain_hash(ds), (), None, "offload"), used)


def test_the_longest_matching_prefix_wins() -> None:
    a, b = digests("s1", "s2", "a3", "a4"), digests("s1", "s2", "b3")
    lines = [line(a[:2], 5), line(a, 1), line(b, 9)]
    assert best_line(lines, [*a, *digests("a5")]) == lines[1]
    assert best_line(lines, [*b, *digests("b4")]) == lines[2]
    assert best_line(lines, [*a[:2], *digests("c3")]) == lines[0]  # a rewind past both
    assert best_line(lines, digests("other")) is None


def test_the_least_recently_used_goes_never_the_new_one() -> None:
    lines = [line(digests(f"x{i}"), used) for i, used in enumerate([4, 1, 3, 2])]
    assert evicted(lines, "new", 4) == (lines[1].name,)
    assert evicted(lines, "new", 2) == (lines[1].name, lines[3].name, lines[2].name)
    assert evicted(lines, lines[0].name, 4) == ()  # the same line again: no growth
    assert next_tick(lines) == 5


def test_a_note_applies_only_to_a_history_that_begins_with_what_it_saw() -> None:
    seen = digests("s1", "s2", "a3")
    note = PreparedSummary("k", "notes", folds="f", covers=3, seen=chain_hash(seen), made=1)
    assert best_note([note], [*seen, *digests("a4")]) == note
    assert best_note([note], [*seen[:2], *digests("b3"), *digests("b4")]) is None
    assert best_note([note], seen[:2]) is None
    old = PreparedSummary("k0", folds="f0", covers=1, seen=chain_hash(seen[:1]), made=0)
    assert evicted_notes([note, old], 1) == (old.seen,)


def sub_agent(first: str, turns: int) -> dict[str, Any]:
    messages = conversation(turns)
    messages[0] = {"role": "user", "content": first}
    return {"model": "claude-test", "max_tokens": 100, "messages": messages}


def test_two_lines_of_one_first_message_keep_their_checkpoints() -> None:
    """Two histories with the same first message (a fork after it) alternate: each one
    reapplies its own checkpoint, neither replaces the other's."""
    simulator = Simulator([policy(target=5_000)], TokenCounter())
    a, b = sub_agent("Fix it", 12), sub_agent("Fix it", 12)
    for message in b["messages"][2::2]:
        message["content"][0]["content"] = "B " + message["content"][0]["content"]
    first = [simulator.step(a).strategy, simulator.step(b).strategy]
    assert first == ["offload", "offload"]
    grown = [
        {**body, "messages": [*body["messages"], {"role": "assistant", "content": "ok"}]}
        for body in (a, b)
    ]
    again = [simulator.step(grown[0]).strategy, simulator.step(grown[1]).strategy]
    assert again == ["checkpoint", "checkpoint"]
    (kept,) = simulator.memory.lines.values()
    assert len(kept) == 2 and simulator.memory.evicted == 0
