"""A crossing past the wait point waits for the summary being made ahead (GetSummary.ahead):
it takes the stored text when its maker stores it, and makes the summary itself when the
maker lets go of the lock without storing one (its summariser call failed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from proxy.core.commands import GetSummary
from proxy.core.usage import Usage
from proxy.server.summariser import SUMMARY, SummariserSettings, obtain_summary
from proxy.store import Store

TENANT, CONVERSATION, KEY = "t-wait", "c-wait", "k-wait"
LOCK = f"summary:{KEY}"
SETTINGS = SummariserSettings(timeout=30.0, wait=0.1, poll=0.01)
ASK = GetSummary(KEY, {"messages": []}, 100, "claude-test", ahead=True)


@pytest.fixture
async def store(redis_url: str, redis_key_prefix: str) -> AsyncIterator[Store]:
    store = Store.from_url(redis_url, prefix=redis_key_prefix, op_timeout=5.0)
    yield store
    await store.close()


async def test_it_takes_the_summary_its_maker_stores(store: Store) -> None:
    maker = await store.acquire_lock(TENANT, CONVERSATION, LOCK, 60_000)
    assert maker is not None
    calls: list[GetSummary] = []

    async def call(need: GetSummary) -> tuple[str, Usage | None]:
        calls.append(need)
        return "a second summary", None

    waiting = asyncio.create_task(
        obtain_summary(
            ASK, store=store, tenant=TENANT, conversation=CONVERSATION, settings=SETTINGS, call=call
        )
    )
    await asyncio.sleep(0.2)  # well past SETTINGS.wait: an ordinary waiter would give up
    assert not waiting.done()
    await store.put_json(TENANT, CONVERSATION, SUMMARY, KEY, "notes made ahead")
    await store.release_lock(TENANT, CONVERSATION, LOCK, maker)
    obtained = await waiting
    assert obtained.reply.text == "notes made ahead" and obtained.reply.reused
    assert calls == [] and obtained.lock is None


async def test_it_makes_the_summary_when_its_maker_let_go_without_one(store: Store) -> None:
    maker = await store.acquire_lock(TENANT, CONVERSATION, LOCK, 60_000)
    assert maker is not None
    calls: list[GetSummary] = []

    async def call(need: GetSummary) -> tuple[str, Usage | None]:
        calls.append(need)
        return "made at the crossing", None

    waiting = asyncio.create_task(
        obtain_summary(
            ASK, store=store, tenant=TENANT, conversation=CONVERSATION, settings=SETTINGS, call=call
        )
    )
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await store.release_lock(TENANT, CONVERSATION, LOCK, maker)  # its call failed
    obtained = await waiting
    assert obtained.reply.text == "made at the crossing" and not obtained.reply.reused
    assert calls == [ASK]
    assert obtained.lock is not None, "held until the crossing's writes store it"
    await obtained.lock.release()
