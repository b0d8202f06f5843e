"""A summary made apart from any crossing (a compaction the proxy serves) is kept by the
executor, which then lets its lock go: stored before a sealed reference names it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest

from proxy.core.commands import GetSummary, SummaryReply
from proxy.core.usage import Usage
from proxy.server.executor import StoreExecutor
from proxy.server.summariser import FREE_SUMMARIES, SUMMARY, SummariserSettings
from proxy.store import Store, StoreUnavailable

TENANT, CONVERSATION, KEY = "t-keep", "c-keep", "k-keep"
ASK = GetSummary(KEY, {"messages": []}, 100, "claude-test")


@pytest.fixture
async def store(redis_url: str, redis_key_prefix: str) -> AsyncIterator[Store]:
    store = Store.from_url(redis_url, prefix=redis_key_prefix, op_timeout=5.0)
    yield store
    await store.close()


def executor(store: Store) -> StoreExecutor:
    async def call(need: GetSummary) -> tuple[str, Usage | None]:
        return "the summary", None

    def background(work: Coroutine[Any, Any, None]) -> None:
        work.close()

    return StoreExecutor(
        store,
        lambda: (TENANT, CONVERSATION),
        summariser=SummariserSettings(timeout=30.0),
        summarise=call,
        background=background,
        count=len,
        spend=FREE_SUMMARIES,
        on_background_call=lambda ok: None,
    )


async def lock_is_free(store: Store) -> bool:
    token = await store.acquire_lock(TENANT, CONVERSATION, f"summary:{KEY}", 1_000)
    if token is None:
        return False
    await store.release_lock(TENANT, CONVERSATION, f"summary:{KEY}", token)
    return True


async def test_the_summary_is_stored_then_its_lock_released(store: Store) -> None:
    run = executor(store)
    reply = await run(ASK)
    assert isinstance(reply, SummaryReply) and reply.text == "the summary"
    assert not await lock_is_free(store), "held from the call until the summary is kept"
    await run.keep_summary(KEY, reply.text)
    assert await store.get_json(TENANT, CONVERSATION, SUMMARY, KEY) == "the summary"
    assert await lock_is_free(store)


async def test_a_summary_not_kept_raises_and_still_lets_the_lock_go(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = executor(store)
    reply = await run(ASK)
    assert isinstance(reply, SummaryReply) and reply.text is not None

    async def down(*args: object, **kwargs: object) -> None:
        raise StoreUnavailable("away")

    monkeypatch.setattr(store, "put_json", down)
    with pytest.raises(StoreUnavailable):
        await run.keep_summary(KEY, reply.text)
    monkeypatch.undo()
    assert await lock_is_free(store)
