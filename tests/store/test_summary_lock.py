"""The one lock a summary is made under (issue 25, finding 4): one holder at a time, its
TTL the longest summariser call plus a margin, released once, and on leaving a block."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from proxy.store import Store, StoreUnavailable, SummaryLock
from proxy.store.summary_lock import MARGIN
from tests.store.test_unavailable import closed_port

T, C, KEY = "tenant-lock", "conv-lock", "k-lock"


async def test_one_holder_at_a_time_under_the_summary_key(store: Store) -> None:
    first = SummaryLock(store, T, C, KEY, call_seconds=10.0)
    second = SummaryLock(store, T, C, KEY, call_seconds=10.0)
    assert first.name == f"summary:{KEY}"
    assert await first.acquire() and first.held
    assert not await second.acquire() and not second.held
    # The same name as the store's own locks: a raw attempt sees it taken.
    assert await store.acquire_lock(T, C, first.name, 1_000) is None
    await first.release()
    assert not first.held
    assert await second.acquire()
    await second.release()


async def test_its_ttl_is_the_longest_call_plus_the_margin(store: Store) -> None:
    lock = SummaryLock(store, T, C, KEY + "-ttl", call_seconds=12.5)
    assert lock.ttl_ms == int((12.5 + MARGIN) * 1000)


async def test_a_release_frees_only_its_own_hold_and_only_once(store: Store) -> None:
    lock = SummaryLock(store, T, C, KEY + "-once", call_seconds=1.0)
    await lock.release()  # never held: nothing to do
    assert await lock.acquire()
    await lock.release()
    other = SummaryLock(store, T, C, KEY + "-once", call_seconds=1.0)
    assert await other.acquire()
    await lock.release()  # released already: the other's hold stays
    assert not await SummaryLock(store, T, C, KEY + "-once", call_seconds=1.0).acquire()
    await other.release()


async def test_leaving_the_block_releases_it_even_on_an_error(store: Store) -> None:
    lock = SummaryLock(store, T, C, KEY + "-ctx", call_seconds=1.0)
    assert await lock.acquire()
    with pytest.raises(RuntimeError):
        async with lock:
            raise RuntimeError("the summariser call broke")
    assert not lock.held
    again = SummaryLock(store, T, C, KEY + "-ctx", call_seconds=1.0)
    assert await again.acquire()
    await again.release()


async def test_a_store_that_is_away_lets_the_lock_expire(
    store: Store, make_store: Callable[..., Store]
) -> None:
    lock = SummaryLock(store, T, C, KEY + "-away", call_seconds=1.0)
    assert await lock.acquire()
    # The same hold seen through a store that cannot be reached.
    away = make_store(f"redis://127.0.0.1:{closed_port()}/0")
    lost = SummaryLock(away, T, C, KEY + "-away", call_seconds=1.0)
    lost._token = "held-before-the-store-went-away"
    await lost.release()  # no exception: it expires by itself
    assert not lost.held
    with pytest.raises(StoreUnavailable):
        await SummaryLock(away, T, C, KEY + "-away", call_seconds=1.0).acquire()
    await lock.release()
