"""Summaries made ahead (issue 12.6): near the trigger the proxy starts the next fold's
summary in the background, so the crossing turn does not wait for the summariser. With a
summariser held back by a gate, the session goes on unfolded (reason summary_pending)
until the summary is ready, then folds with it; only far over the trigger would a turn
wait (tests/core/test_driver.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import uuid
from typing import Any

import anthropic
import orjson
import pytest

from proxy.core.facts import Facts
from proxy.server import summariser
from proxy.server.app import start
from proxy.server.state import COMPACTOR
from proxy.testing.agent import Turn, run_agent
from proxy.testing.standin import StandInOptions
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import SMALL_WINDOW, MakeProxy, proxy_settings

PURPOSE = "x-compaction-proxy-purpose"


async def test_a_crossing_turn_does_not_wait_for_the_summariser(
    make_standin: Any, make_compacting_proxy: MakeProxy
) -> None:
    gate = asyncio.Event()
    standin: RunningStandIn = await make_standin(
        StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None, summary_gate=gate)
    )
    proxy = await make_compacting_proxy(standin.url)
    compactor = proxy.app[COMPACTOR]
    pending: list[int] = []

    def summary_calls() -> list[Any]:
        return [r for r in standin.recorded if r.headers.get(PURPOSE) == "summary"]

    async def on_turn(t: int, turn: Turn) -> None:
        if turn.headers.get("x-compaction-reason") != "summary_pending":
            return
        pending.append(t)
        # While the summary is held, every call to the summariser is still open: none of
        # the agent's turns is waiting on it.
        assert all(r.outcome == "open" for r in summary_calls())
        if len(pending) == 2:
            gate.set()  # the summariser answers: the next crossing folds with its notes
            await compactor.settled()

    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-ahead", max_retries=0)
    turns = await run_agent(
        client, turns=24, result_chars=3_000, conversation=uuid.uuid4().hex, on_turn=on_turn
    )
    await client.close()
    await compactor.settled()

    assert len(pending) >= 2, "the summary was never pending: the gate tested nothing"
    folded = [t for t in turns if t.headers.get("x-compaction-summary") == "ahead"]
    assert folded, "no fold used the summary made ahead"
    assert not [t for t in turns if t.headers.get("x-compaction-summary") == "made"], (
        "a crossing waited for its summary"
    )
    first = turns.index(folded[0])
    assert first == pending[-1] + 1, "the first turn after the summary was ready folds"
    # Each summary was asked once, as the conversation's own request (in place).
    calls = summary_calls()
    assert calls and all(r.outcome == "complete" for r in calls)
    keys = [orjson.loads(r.body)["messages"][-1]["content"][0]["text"] for r in calls]
    assert len(set(keys)) == len(keys), "a summary was asked for twice"
    agent = [r for r in standin.recorded if not r.headers.get(PURPOSE)]
    assert all(r.outcome == "complete" for r in agent) and len(agent) == len(turns)
    assert all(orjson.loads(r.body)["messages"] for r in agent)
    for t in turns:
        assert int(t.headers.get("x-compaction-tokens-after", "0")) <= SMALL_WINDOW


async def test_turns_never_rank_identifiers_only_a_summary_made_ahead_does(
    make_standin: Any, make_compacting_proxy: MakeProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranking the folded turns' identifiers (for the facts line) runs a pattern over all
    they hold: it belongs to a summary once made, in the background, never to an agent's
    turn (the turns that start a summary ahead, go on while it is pending, or fold with
    it)."""
    gate = asyncio.Event()
    standin: RunningStandIn = await make_standin(
        StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None, summary_gate=gate)
    )
    proxy = await make_compacting_proxy(standin.url)
    compactor = proxy.app[COMPACTOR]
    loop_thread = threading.get_ident()
    ranked: list[tuple[bool, bool]] = []  # (on the event loop's thread, summariser answered)
    rank = Facts.ranked

    def spy(facts: Facts) -> list[str]:
        ranked.append((threading.get_ident() == loop_thread, gate.is_set()))
        return rank(facts)

    monkeypatch.setattr(Facts, "ranked", spy)
    pending = 0

    async def on_turn(t: int, turn: Turn) -> None:
        nonlocal pending
        if turn.headers.get("x-compaction-reason") != "summary_pending":
            return
        pending += 1
        if pending == 2:
            assert ranked == [], "a turn ranked identifiers while its summary was pending"
            gate.set()
            await compactor.settled()

    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-rank", max_retries=0)
    turns = await run_agent(
        client, turns=24, result_chars=3_000, conversation=uuid.uuid4().hex, on_turn=on_turn
    )
    await client.close()
    await compactor.settled()

    assert pending >= 2, "the summary was never pending: the gate tested nothing"
    assert [t for t in turns if t.headers.get("x-compaction-summary") == "ahead"]
    assert not [t for t in turns if t.headers.get("x-compaction-summary") == "made"]
    summaries = [r for r in standin.recorded if r.headers.get(PURPOSE) == "summary"]
    # Once per summary made ahead, after its answer, off the event loop; never in a turn.
    assert len(ranked) == len(summaries) > 0
    assert all(not on_loop and answered for on_loop, answered in ranked)


# Results kept whole (1,200 tokens a turn): the history reaches the wait point a few
# turns after the prepare point, and folding the groups the summary made ahead covers
# brings it well under the trigger.
FAST_POLICY: dict[str, Any] = {
    "match": "*",
    "window": SMALL_WINDOW,
    "trigger": 12_000,
    "target": 5_000,
    "keep_last": 2,
    "offload_threshold": 100_000,
    "summary_max_tokens": 1_500,
}


async def test_at_the_wait_point_the_crossing_waits_for_the_summary_made_ahead(
    make_standin: Any, redis_url: str, redis_key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent faster than its summariser reaches the wait point while the summary made
    ahead is still being made: the crossing waits for that call, and no second summary
    is asked for (the summariser's gate opens only once the crossing is waiting)."""
    gate = asyncio.Event()
    standin: RunningStandIn = await make_standin(
        StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None, summary_gate=gate)
    )
    settings = proxy_settings(standin.url, redis_url, **{"store.key_prefix": redis_key_prefix})
    proxy = await start(dataclasses.replace(settings, policies=(FAST_POLICY,)))
    compactor = proxy.app[COMPACTOR]

    def summary_calls() -> list[Any]:
        return [r for r in standin.recorded if r.headers.get(PURPOSE) == "summary"]

    waiting = asyncio.Event()
    open_then: list[int] = []
    wait_for_ahead = summariser._wait_for_ahead

    async def spy(*args: Any, **kwargs: Any) -> tuple[str | None, str | None]:
        open_then.append(len([r for r in summary_calls() if r.outcome == "open"]))
        waiting.set()
        return await wait_for_ahead(*args, **kwargs)

    monkeypatch.setattr(summariser, "_wait_for_ahead", spy)

    async def release_when_waited_for() -> None:
        await waiting.wait()
        gate.set()

    releaser = asyncio.create_task(release_when_waited_for())
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-wait", max_retries=0)
    try:
        turns = await asyncio.wait_for(
            run_agent(client, turns=16, result_chars=3_000, conversation=uuid.uuid4().hex),
            timeout=30,
        )
    finally:
        await client.close()
        releaser.cancel()
        gate.set()  # (when the test failed: let the summary made ahead end)
        await compactor.settled()
        await proxy.stop()

    assert open_then[:1] == [1], "the crossing waited while the one summary was being made"
    states = [t.headers.get("x-compaction-summary") for t in turns]
    assert "made" not in states, "a crossing had a second summary made"
    assert "waited" in states, "the crossing that waited does not say so"
    pending = [t for t in turns if t.headers.get("x-compaction-reason") == "summary_pending"]
    assert pending, "the history never went on unfolded: the wait point was not reached"
    folded = [t for t in turns if t.headers.get("x-compaction-strategy") == "summary"]
    # The first fold comes right after the turns that went on unfolded before it (a later
    # crossing may be pending in its turn: the trigger stays where it is after a fold).
    first = turns.index(folded[0]) if folded else -1
    before = [turns.index(t) for t in pending if turns.index(t) < first]
    assert folded and before and first == before[-1] + 1
    calls = summary_calls()
    assert calls and all(r.outcome == "complete" for r in calls)
    # The fold went upstream with the notes of the summary it waited for.
    agent = [r for r in standin.recorded if not r.headers.get(PURPOSE)]
    notes = calls[0].content[0]["text"]
    assert orjson.dumps(notes[:80])[1:-1] in agent[turns.index(folded[0])].body
