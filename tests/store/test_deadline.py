"""A store call's deadline is Redis's time, not the event loop's (proxy/store/deadline.py):
an answer Redis sent in time is taken though the loop came to it past op_timeout; a Redis
that does not answer still fails the call after op_timeout and its grace."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
import redis.asyncio

from proxy.store import EmbeddedRedis, Store, StoreUnavailable
from proxy.store.deadline import GRACE, MOST, moved

T, C = "tenant0", "conv0"


def test_the_first_deadline_gives_one_more_look_and_the_loops_lateness() -> None:
    # Come to on time: the grace (a tenth of the call's time).
    assert moved(0.5, 0.0, 0.5, 0.5, first=True) == pytest.approx(0.5 + 0.5 * GRACE)
    # Come to 0.3 s late (the loop was busy): those 0.3 s given back.
    assert moved(0.5, 0.0, 0.5, 0.8, first=True) == pytest.approx(1.1)
    # However late: the answer may be waiting in the socket since long before.
    assert moved(0.5, 0.0, 0.5, 9.0, first=True) == pytest.approx(17.5)


def test_a_later_deadline_moves_only_when_the_loop_came_late_and_not_past_most() -> None:
    assert moved(0.5, 0.0, 0.55, 0.55, first=False) is None  # on time: failed
    assert moved(0.5, 0.0, 0.55, 0.59, first=False) is None  # within the grace (0.05 s)
    assert moved(0.5, 0.0, 0.55, 0.9, first=False) == pytest.approx(1.25)  # 0.35 s late
    assert moved(0.5, 0.0, 1.9, 2.0 + 0.5, first=False) is None  # past MOST times 0.5 s
    assert MOST * 0.5 == 2.0


async def _answered_while_the_loop_is_busy(server: EmbeddedRedis, call: Callable[[], object],
                                           op_timeout: float) -> object:  # fmt: skip
    """`call` made while Redis sleeps 50 ms (its answer comes then) and the event loop is
    held from 10 ms on for one and a half op_timeouts: the answer waits in the socket
    until the loop comes back, past the call's deadline."""
    other = redis.asyncio.Redis.from_url(server.url)
    try:
        await other.ping()
        asleep = asyncio.ensure_future(other.execute_command("DEBUG", "SLEEP", "0.05"))
        await asyncio.sleep(0.005)  # the sleep reached Redis: the call's answer waits for it
        asyncio.get_running_loop().call_later(0.01, time.sleep, op_timeout * 1.5)
        try:
            return await call()  # type: ignore[misc]
        finally:
            await asleep
    finally:
        await other.aclose()


async def test_an_answer_redis_sent_in_time_is_taken_though_the_loop_came_late(
    make_store: Callable[..., Store], embedded_redis: Callable[[], EmbeddedRedis]
) -> None:
    server = embedded_redis()
    store = make_store(server.url, op_timeout=0.2)
    await store.put_json(T, C, "summary", "k", "the summary")
    await store.get_json(T, C, "summary", "k")  # a connection in the pool, ready

    started = time.monotonic()
    found = await _answered_while_the_loop_is_busy(
        server, lambda: store.get_json(T, C, "summary", "k"), 0.2
    )
    assert found == "the summary"
    assert time.monotonic() - started == pytest.approx(0.3, abs=0.1)  # the loop's hold


async def test_a_redis_that_does_not_answer_fails_the_call_after_op_timeout_and_its_grace(
    make_store: Callable[..., Store], embedded_redis: Callable[[], EmbeddedRedis]
) -> None:
    server = embedded_redis()
    store = make_store(server.url, op_timeout=0.2)
    await store.put_json(T, C, "summary", "k", "the summary")
    other = redis.asyncio.Redis.from_url(server.url)
    try:
        await other.ping()
        asleep = asyncio.ensure_future(other.execute_command("DEBUG", "SLEEP", "1"))
        await asyncio.sleep(0.005)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await store.get_json(T, C, "summary", "k")
        took = time.monotonic() - started
        await asleep
    finally:
        await other.aclose()
    assert 0.2 <= took < 0.2 * (1 + GRACE) + 0.1
    assert await store.get_json(T, C, "summary", "k") == "the summary"  # answers in order
