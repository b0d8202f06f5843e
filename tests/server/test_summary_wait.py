"""A crossing past the wait point waits for the summary being made ahead (GetSummary.ahead):
it takes the stored text when its maker stores it, and makes the summary itself when the
maker lets go of the lock without storing one (its summariser call failed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from proxy.core.commands import GetSummary
from proxy.core.usage import Usage
from proxy.server.summariser import SUMMARY, SummariserSettings, obtain_summary
from proxy.store import Store
from tests.store.test_unavailable import closed_port

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


async def test_a_store_that_cannot_be_read_is_said_unread_not_a_failed_summary() -> None:
    """No summary for want of the store (it may be stored): `unread`, so the crossing
    stores nothing on it (tests/core/test_driver.py)."""
    away = Store.from_url(f"redis://127.0.0.1:{closed_port()}/0", op_timeout=0.2)
    calls: list[GetSummary] = []

    async def call(need: GetSummary) -> tuple[str, Usage | None]:
        calls.append(need)
        return "", None

    try:
        for ask in (ASK, replace(ASK, ahead=False)):
            obtained = await obtain_summary(
                ask, store=away, tenant=TENANT, conversation=CONVERSATION, settings=SETTINGS,
                call=call,
            )  # fmt: skip
            assert obtained.reply.text is None and obtained.reply.unread
            assert obtained.reply.failure.startswith("store unavailable")
    finally:
        await away.close()
    assert calls == []


async def test_a_summariser_that_answers_nothing_is_no_unread_store(store: Store) -> None:
    async def call(need: GetSummary) -> tuple[str, Usage | None]:
        return "", None

    ask = replace(ASK, key="k-empty", ahead=False)
    obtained = await obtain_summary(
        ask, store=store, tenant=TENANT, conversation=CONVERSATION, settings=SETTINGS, call=call
    )
    assert obtained.reply.text is None and not obtained.reply.unread
    assert obtained.reply.failure == "the summariser answered with no text"
