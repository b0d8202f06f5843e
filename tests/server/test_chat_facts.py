"""Planted facts survive the chat-heavy session's folds with the default policy.

bench/facts.py's session, shortened to 100 turns (several folds, the loss happens at the
first): the chat shape's seeded reasoning, 30 facts planted
in its first 15 turns (ports, paths, names, settings, decisions with their reason), live
through a proxy with the built-in policy (window 200,000, trigger 60,000) to the
stand-in, whose summariser writes notes capped at summary_max_tokens. What the summary
leaves out, the proxy appends from the identifiers it ranks (proxy/core/facts.py): a fact
of a shape it did not recognise (`port 6391`, `HTTP 409`, `s3://...`, `ledger.strict_mode`,
`PLEDGR7`, `ledger-pg-eu-3`) was lost (22/30 before).
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest

import bench.facts
from bench.facts import (
    FACTS,
    PLANTED_RESULTS,
    RESULTS_WINDOW,
    kept,
    last_agent_request,
    planted,
    result_texts,
    session,
)
from bench.make_trace import SHAPES, reasoning
from bench.replay import PURPOSE, WINDOW, serve_standin, with_policy
from proxy.server.app import start
from proxy.testing.agent import Turn
from proxy.testing.standin import RECORDED
from tests.server.conftest import proxy_settings
from tests.server.store_faults import FailingLoad

TURNS = 100


async def test_the_chat_heavy_session_keeps_29_of_its_30_planted_facts(
    redis_url: str, redis_key_prefix: str
) -> None:
    url, app, runner = await serve_standin(WINDOW)
    proxy = await start(proxy_settings(url, redis_url, **{"store.key_prefix": redis_key_prefix}))
    try:
        turns = await session(proxy.url, argparse.Namespace(turns=TURNS, seed=12))
    finally:
        await proxy.stop()
    recorded = list(app[RECORDED])
    await runner.cleanup()

    assert len(turns) == TURNS
    assert all(r.status == 200 for r in recorded)
    summaries = [r for r in recorded if r.headers.get(PURPOSE) == "summary"]
    assert len(summaries) >= 2, "the session must fold more than once"
    last = last_agent_request(recorded)
    early = "\n".join(str(m.get("content")) for m in last["messages"][:3])
    assert "Turn 0:" not in early, "the planted turns must have been folded"
    held = kept(last)
    assert len(held) >= 29, f"lost {[f.check for f in FACTS if f not in held]}"


def test_the_thirty_facts_are_distinct_and_planted_only_in_the_first_turns() -> None:
    low, high = SHAPES["chat"][2]
    text = planted(12, low, high)
    plain = reasoning(12, low, high)
    checks = [f.check for f in FACTS]
    assert len(FACTS) == 30 and len(set(checks)) == 30
    early = " ".join(text(t) for t in range(15))
    assert all(f.sentence in early and f.check in early for f in FACTS)
    later = " ".join(text(t) for t in range(15, 160)) + " ".join(plain(t) for t in range(15))
    assert not [c for c in checks if c in later], "a check string the prose says anyway"


def test_the_results_session_plants_each_fact_once_in_its_first_results() -> None:
    results = result_texts(12, 160)
    assert len(results) == 160 and PLANTED_RESULTS == 15
    for fact in FACTS:
        holding = [n for n, text in enumerate(results) if fact.check in text]
        assert holding == [FACTS.index(fact) // 2], fact.check
    sizes = [len(text) for text in results]
    assert min(sizes) >= 1_000 and max(sizes) <= 26_000


async def test_facts_in_offloaded_results_survive_the_fold_that_takes_them(
    redis_url: str, redis_key_prefix: str
) -> None:
    """bench/facts.py's results session, shortened to its first fold (60 turns): the facts
    sit in the middle of results offloaded long before the fold, so only a summariser
    shown their originals whole can keep them (the stand-in's keeps those it is shown)."""
    keeps = tuple(f.check for f in FACTS)
    url, app, runner = await serve_standin(RESULTS_WINDOW, summary_keeps=keeps)
    settings = proxy_settings(url, redis_url, **{"store.key_prefix": redis_key_prefix})
    proxy = await start(with_policy(settings, f"window={RESULTS_WINDOW}"))
    try:
        args = argparse.Namespace(session="results", turns=60, seed=12)
        turns = await session(proxy.url, args)
    finally:
        await proxy.stop()
    recorded = list(app[RECORDED])
    await runner.cleanup()

    assert len(turns) == 60
    assert all(r.status == 200 for r in recorded)
    assert [r for r in recorded if r.headers.get(PURPOSE) == "summary"], "it must fold"
    last = last_agent_request(recorded)
    assert "# NOTE:" not in str(last["messages"]), "the planted results must have been folded"
    held = kept(last)
    assert len(held) >= 29, f"lost {[f.check for f in FACTS if f not in held]}"


async def test_offloaded_facts_survive_a_turn_whose_load_failed(
    redis_url: str, redis_key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The results session above failed once under load the way test_summary_facts.py's
    did (see there): one turn's load of the conversation's state failed (a timeout while
    the event loop was busy), that turn packed the history as sent, and the pack was saved
    as the conversation's line, so the last turn held none of the facts. Here turn 29's
    load fails (just past the first summary made ahead): that turn packs, stores nothing,
    and the session goes on from its line."""
    fault = FailingLoad(monkeypatch, after=28)
    agent = bench.facts.run_agent

    async def run_agent(*args: Any, **kwargs: Any) -> list[Turn]:
        return await agent(*args, on_turn=fault.on_turn, **kwargs)

    monkeypatch.setattr(bench.facts, "run_agent", run_agent)
    keeps = tuple(f.check for f in FACTS)
    url, app, runner = await serve_standin(RESULTS_WINDOW, summary_keeps=keeps)
    settings = proxy_settings(url, redis_url, **{"store.key_prefix": redis_key_prefix})
    proxy = await start(with_policy(settings, f"window={RESULTS_WINDOW}"))
    try:
        turns = await session(proxy.url, argparse.Namespace(session="results", turns=60, seed=12))
    finally:
        await proxy.stop()
    recorded = list(app[RECORDED])
    await runner.cleanup()

    assert fault.failed, "no load failed: the test tests nothing"
    assert turns[29].headers.get("x-compaction-reason") == "store_unavailable"
    held = kept(last_agent_request(recorded))
    assert len(held) >= 29, f"lost {[f.check for f in FACTS if f not in held]}"
    assert [r for r in recorded if r.headers.get(PURPOSE) == "summary"], "it must fold"
