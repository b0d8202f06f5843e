"""The proxy's cache breakpoint goes where the next offload step leaves the history as it
is (issue 35): before the oldest result kept whole that will be stubbed as it ages, so the
next request reads everything before that result from the cache and writes from its stub
on, instead of writing the turn between the stubbed region and that result again."""

from __future__ import annotations

from itertools import pairwise

from proxy.core.outcome import Rewrite
from tests.core.test_planner import conversation, planned, policy

OFFLOADING = policy(window=200_000, trigger=100_000, target=80_000, offload_trigger=2_000)


def test_the_breakpoint_is_where_the_next_offload_step_leaves_the_history_as_it_is() -> None:
    messages = conversation(20, result_words=400)
    earlier = None
    for turns in range(6, 20):
        sent = messages[: 2 * turns + 1]
        out = planned(sent, earlier.checkpoint if earlier else None, policy=OFFLOADING)
        assert isinstance(out, Rewrite) and out.strategy in ("offload", "checkpoint")
        # The newest result is kept whole and is the next to be stubbed: the breakpoint
        # is on the assistant message before it, after the last stub.
        assert out.breakpoint_at == len(out.messages) - 2
        if earlier is not None:
            at = earlier.breakpoint_at
            assert at is not None
            assert out.messages[: at + 1] == earlier.messages[: at + 1]
        earlier = out


def test_with_nothing_left_to_stub_the_breakpoint_ends_the_stubbed_region() -> None:
    messages = conversation(10, result_words=400)
    small = {"role": "user", "content": [{**messages[-1]["content"][0], "content": "ok"}]}
    first = planned([*messages[:-1], small], policy=OFFLOADING)
    assert isinstance(first, Rewrite) and first.strategy == "offload"
    # The newest result is too small to be stubbed: the last stub is where it ends.
    assert first.breakpoint_at == len(first.messages) - 3


def test_in_batches_the_history_sent_stays_the_same_between_them() -> None:
    batched = policy(
        window=200_000, trigger=100_000, target=80_000, offload_trigger=2_000, offload_batch=3
    )
    messages = conversation(24, result_words=400)
    earlier: Rewrite | None = None
    stored = None  # the conversation's checkpoint, as the store keeps it
    steps = []
    for turns in range(6, 24):
        sent = messages[: 2 * turns + 1]
        out = planned(sent, stored, policy=batched)
        assert isinstance(out, Rewrite)
        stored = out.checkpoint or stored
        if earlier is not None and out.strategy == "checkpoint":
            # No new stub: what went before goes again, appended to, as it was.
            assert out.messages[: len(earlier.messages)] == earlier.messages
        if out.strategy == "offload":
            steps.append((turns, len(out.blobs)))
        earlier = out
    # After the first step (all that had aged), one step every three turns, of three.
    assert len(steps) >= 4 and all(stubbed == 3 for _, stubbed in steps[1:])
    assert all(b - a == 3 for (a, _), (b, _) in pairwise(steps[1:]))
