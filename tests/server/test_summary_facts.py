"""Facts survive folding, by construction: a long session through several summaries keeps
the identifiers planted in its first turns, though its summariser drops a fifth of what it
sees; and no upstream request ever names a ref without offering the tool to read it."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import orjson
import pytest
import redis.asyncio

from proxy.store import EmbeddedRedis, Store
from proxy.testing.agent import Turn, run_agent, tool_output
from proxy.testing.standin import RecordedRequest, StandInOptions
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import SMALL_WINDOW, MakeProxy
from tests.server.store_faults import FailingLoad

TURNS = 150
RESULT_CHARS = 3_000
PLANTED = [
    *(f"services/billing/ledger_{name}.py" for name in ("sync", "audit", "export")),
    *(f"ERR_LEDGER_{code}" for code in ("SKEW", "DRIFT", "GAP", "LOCK")),
    *(f"reconcile_{what}_entries" for what in ("ledger", "refund", "payout", "fee")),
    *(f"{name}Worker" for name in ("LedgerSync", "RefundQueue", "PayoutBatch")),
    *(f"https://ci.example.com/builds/{n}" for n in (8812, 9031)),
    *(f"E{n}" for n in (4521, 4533, 4590)),
    *(f"{m}_TIMEOUT_MS" for m in ("LEDGER", "REFUND", "PAYOUT")),
    *(f"migrate_{v}_schema" for v in ("v12", "v13", "v14")),
    *(f"{h}cafe42" for h in ("9a1b", "7c2d", "3e4f", "1a2b", "5d6e")),
]
PURPOSE = "x-compaction-proxy-purpose"
FOLDED = ("made", "ahead", "waited")  # x-compaction-summary of a turn that folded
REF = re.compile(rb"r_[0-9a-f]{16}")


def planted_output(turn: int, chars: int) -> str:
    """A build log; the first 20 turns each also state one or two planted facts."""
    facts = PLANTED[turn * 3 // 2 : (turn + 1) * 3 // 2] if turn < 20 else []
    said = "".join(f"NOTE: the failure involves {fact}\n" for fact in facts)
    return said + tool_output(turn, chars - len(said))


async def _planted(
    make_standin: Any, make_compacting_proxy: MakeProxy, turns: int, redis_url: str | None = None,
    on_turn: Callable[[int, Turn], Awaitable[None]] | None = None,
) -> tuple[list[Turn], list[RecordedRequest]]:  # fmt: skip
    """A planted session of `turns` through a compacting proxy (on `redis_url`, else the
    test's Redis) and a lossy summariser: its turns, and the Messages requests upstream."""
    standin: RunningStandIn = await make_standin(
        StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None, summary_loss=5)
    )
    proxy = await make_compacting_proxy(standin.url, redis=redis_url)
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-facts", max_retries=0)
    try:
        played = await run_agent(
            client,
            turns=turns,
            result_chars=RESULT_CHARS,
            conversation=uuid.uuid4().hex,
            output=planted_output,
            on_turn=on_turn,
        )
    finally:
        await client.close()
    return played, [r for r in standin.recorded if r.path_qs.startswith("/v1/messages")]


def _kept(calls: list[RecordedRequest]) -> list[str]:
    """The planted facts the last agent request (not the summariser's) holds."""
    last = orjson.loads([r for r in calls if not r.headers.get(PURPOSE)][-1].body)
    text = orjson.dumps(last["messages"]).decode()
    return [fact for fact in PLANTED if fact in text]


def test_thirty_facts_are_planted_in_the_first_twenty_turns() -> None:
    assert len(PLANTED) == 30
    seen = "".join(planted_output(t, RESULT_CHARS) for t in range(20))
    assert all(fact in seen for fact in PLANTED)


async def test_a_long_session_keeps_its_early_facts_through_a_lossy_summariser(
    make_standin: Any, make_compacting_proxy: MakeProxy
) -> None:
    turns, calls = await _planted(make_standin, make_compacting_proxy, TURNS)

    assert _folds(turns) >= 3, "the session must fold several times"
    assert all(r.status == 200 for r in calls)
    summaries = [r for r in calls if r.headers.get(PURPOSE) == "summary"]
    # The summariser dropped some planted facts: the proxy had something to restore.
    dropped = {fact for r in summaries for fact in PLANTED if fact.encode() in r.body and
               fact not in " ".join(b.get("text", "") for b in r.content)}  # fmt: skip
    assert dropped, "the lossy summariser left nothing out: the test tests nothing"

    kept = _kept(calls)
    story = [
        "/".join(t.headers.get(f"x-compaction-{h}", "-") for h in ("strategy", "summary", "reason"))
        for t in turns
    ]
    assert len(kept) >= 29, f"lost {sorted(set(PLANTED) - set(kept))}; turns {story}"

    for r in calls:
        if r.headers.get(PURPOSE):
            continue
        body = orjson.loads(r.body)
        named = REF.findall(orjson.dumps(body["messages"]))
        offered = {t.get("name") for t in body.get("tools") or []}
        assert not named or "read_result" in offered, "a ref named with no tool to read it"


# The rare loss of all 30 facts above (CI, whole suite, 1 of 1556) had one cause in two
# parts. A turn's load of the conversation's state timed out though Redis had answered:
# the event loop (the proxy's, the stand-in's and the agent's here; a busy replica's in
# production), busy past op_timeout with the summary made ahead the turn before, came
# back to the answer in the same pass as to the expired timer. That turn was then planned
# without its checkpoint: the history as sent, packed, its summary gone; and the pack
# was saved as the conversation's line, so every later turn went on without the facts.
SHORT_SESSION = 50  # three or four folds


async def _session(
    make_standin: Any, make_compacting_proxy: MakeProxy, redis_url: str,
    on_turn: Callable[[int, Turn], Awaitable[None]],
) -> tuple[list[Turn], list[str]]:  # fmt: skip
    """A short planted session through a proxy on `redis_url`: its turns, and the planted
    facts its last request holds."""
    turns, calls = await _planted(
        make_standin, make_compacting_proxy, SHORT_SESSION, redis_url, on_turn
    )
    return turns, _kept(calls)


def _folds(turns: list[Turn]) -> int:
    return len([t for t in turns if t.headers.get("x-compaction-summary") in FOLDED])


async def test_a_load_redis_answered_while_the_loop_was_busy_is_taken(
    make_standin: Any,
    make_compacting_proxy: MakeProxy,
    embedded_redis: Callable[[], EmbeddedRedis],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis answers the last turn's load 50 ms late (DEBUG SLEEP) while the event loop
    is held past op_timeout: the answer is taken (proxy/store/deadline.py), and the turn
    is planned with the conversation's state, its facts kept."""
    server = embedded_redis()
    other = redis.asyncio.Redis.from_url(server.url)
    await other.ping()
    load = Store.load_conversation
    hold = {"armed": False, "held": False}

    async def late(store: Store, *args: Any, **kwargs: Any) -> Any:
        if not hold["armed"]:
            return await load(store, *args, **kwargs)
        hold["armed"], hold["held"] = False, True
        asleep = asyncio.ensure_future(other.execute_command("DEBUG", "SLEEP", "0.05"))
        await asyncio.sleep(0.005)  # Redis sleeps: the load's answer comes in 50 ms,
        # while the loop is held from 10 ms on, past op_timeout
        asyncio.get_running_loop().call_later(0.01, time.sleep, store.op_timeout * 1.5)
        try:
            return await load(store, *args, **kwargs)
        finally:
            await asleep

    async def on_turn(t: int, turn: Turn) -> None:
        hold["armed"] = t == SHORT_SESSION - 2  # the last turn's load is held

    monkeypatch.setattr(Store, "load_conversation", late)
    try:
        turns, kept = await _session(make_standin, make_compacting_proxy, server.url, on_turn)
    finally:
        await other.aclose()

    assert hold["held"], "the last turn's load was never held: the test tests nothing"
    last_turn = turns[-1].headers
    assert len(kept) >= 29, f"lost {sorted(set(PLANTED) - set(kept))}; last turn {last_turn}"
    assert "pack" not in last_turn.get("x-compaction-strategy", ""), last_turn
    assert last_turn.get("x-compaction-reason") != "store_unavailable", last_turn
    assert _folds(turns) >= 3


async def test_a_turn_whose_load_failed_leaves_the_line_to_the_turns_after_it(
    make_standin: Any,
    make_compacting_proxy: MakeProxy,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One turn's load fails (the store answers again for its writes): that turn packs
    the history as sent (reason store_unavailable) and saves nothing, so the turns after
    it go on from the conversation's line and the last one still holds the facts."""
    fault = FailingLoad(monkeypatch, after=30)  # between the first fold and the second
    turns, kept = await _session(make_standin, make_compacting_proxy, redis_url, fault.on_turn)

    assert fault.failed, "no load failed: the test tests nothing"
    unread = turns[31].headers
    assert unread.get("x-compaction-reason") == "store_unavailable", unread
    assert "pack" in unread.get("x-compaction-strategy", ""), unread
    story = [t.headers.get("x-compaction-summary") for t in turns[32:]]
    assert len(kept) >= 29, f"lost {sorted(set(PLANTED) - set(kept))}; after it {story}"
    assert _folds(turns) >= 3
