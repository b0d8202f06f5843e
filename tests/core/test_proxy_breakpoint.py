"""The proxy's cache breakpoint goes where the next offload step leaves the history as it
is (issue 35): before the oldest result kept whole that will be stubbed as it ages, so the
next request reads everything before that result from the cache and writes from its stub
on, instead of writing the turn between the stubbed region and that result again."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from itertools import pairwise

from proxy.core.checkpoint import Checkpoint
from proxy.core.outcome import Planned, Rewrite
from proxy.wire.anthropic import ANTHROPIC
from proxy.wire.chat import CHAT
from proxy.wire.gemini import GEMINI
from proxy.wire.responses import RESPONSES
from tests.core.test_planner import COUNTER, conversation, planned, policy
from tests.core.test_planner_chat import conversation as chat_conversation
from tests.core.test_planner_chat import planned as chat_planned

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


def _offload_steps(plan_at: Callable[[int, Checkpoint | None], Planned], turns: int) -> list[int]:
    """The turns at which an offload step stubbed results, the policy naming no batch."""
    stored: Checkpoint | None = None
    steps = []
    for n in range(6, turns):
        out = plan_at(n, stored)
        assert isinstance(out, Rewrite)
        stored = out.checkpoint or stored
        if out.strategy == "offload":
            steps.append(n)
    return steps


def test_the_batch_is_the_formats_when_the_policy_names_none() -> None:
    # Messages: the proxy's breakpoint makes a step every turn cheap, so as each ages.
    # OpenAI's formats (and Gemini) cache prefixes by themselves, with no breakpoint to
    # place: PREFIX_CACHED_BATCH results at once, the history unchanged between.
    assert OFFLOADING.offload_batch == 0
    assert ANTHROPIC.offload_batch == 1
    assert CHAT.offload_batch == RESPONSES.offload_batch == GEMINI.offload_batch > 1
    messages = conversation(24, result_words=400)
    on_messages = _offload_steps(
        lambda n, cp: planned(messages[: 2 * n + 1], cp, policy=OFFLOADING), 24
    )
    assert all(b - a == 1 for a, b in pairwise(on_messages)) and len(on_messages) >= 10
    chat = chat_conversation(24, result_words=400)
    chat_policy = replace(OFFLOADING, keep_last=2, offload_threshold=300, note_cost=60)
    on_chat = _offload_steps(
        lambda n, cp: chat_planned(chat[: 2 * n + 2], cp, policy=chat_policy), 24
    )
    assert len(on_chat) >= 3
    assert all(b - a == CHAT.offload_batch for a, b in pairwise(on_chat[1:]))


def test_the_newest_result_goes_uncached_when_the_next_request_stubs_it() -> None:
    """Stubbed by the next request, the newest result is never read whole from the cache:
    the proxy's breakpoint before it carries the cache, and the client's own on it is
    dropped, so it is sent uncached (1.0 a token) instead of written (1.25)."""
    from proxy.core.driver import commands_of, compaction
    from tests.core.test_driver import Store, request

    messages = conversation(14, result_words=400)
    newest = messages[-1]["content"][-1]
    messages[-1] = {**messages[-1], "content": [{**newest, "cache_control": {"type": "ephemeral"}}]}
    _, decision = commands_of(compaction(request(messages, OFFLOADING)), Store())
    rewrite = decision.rewrite
    assert rewrite is not None and rewrite.uncached_tail and decision.sent is not None
    sent = decision.sent["messages"]
    assert rewrite.breakpoint_at == len(sent) - 2
    assert sent[-2]["content"][-1]["cache_control"] == {"type": "ephemeral"}  # the proxy's
    assert all("cache_control" not in block for block in sent[-1]["content"])
    assert sent[-1]["content"][0]["content"] == newest["content"]  # whole, only unmarked
    assert b'"cache_control"' in (decision.body or b"")

    # Where the next request may keep it whole, the client's breakpoint stays.
    for kept in (
        replace(OFFLOADING, keep_results=2),  # the next request keeps it whole
        replace(OFFLOADING, offload_batch=3),  # stubbed with others, later
    ):
        _, decision = commands_of(compaction(request(messages, kept)), Store())
        rewrite = decision.rewrite
        assert rewrite is not None and not rewrite.uncached_tail and decision.sent is not None
        assert decision.sent["messages"][-1]["content"][-1]["cache_control"] == {
            "type": "ephemeral"
        }


def test_the_newest_result_stays_cached_when_the_next_turn_may_not_offload() -> None:
    """Under the offload trigger even with a turn like the newest added, the next request
    may leave the newest result whole: it is written to the cache as the client asked.
    Past it by that turn, it is not."""
    messages = conversation(14, result_words=400)
    first = planned(messages, policy=OFFLOADING)
    assert isinstance(first, Rewrite) and first.uncached_tail
    history = sum(COUNTER.count_message(m) for m in first.messages)
    newest = COUNTER.count_message(first.messages[-1])
    high = replace(OFFLOADING, offload_trigger=history + newest + 10)
    assert first.checkpoint is not None
    quiet = planned(messages, first.checkpoint, policy=high)
    assert isinstance(quiet, Rewrite) and quiet.strategy == "checkpoint"
    assert not quiet.uncached_tail
    near = replace(OFFLOADING, offload_trigger=history + newest - 10)
    assert planned(messages, first.checkpoint, policy=near).uncached_tail
