"""Shutdown is bounded (issue 21, finding 9).

A clean-clone CI run once waited past 120 s in a fixture's finalizer: the proxy's stop
awaited a background task without a bound, and a task whose cancellation was turned
into a timeout by a Redis call (the admin stats' flush loop retries on those; so would
the revocation watch) never ended. Now every background task is stopped by
`stop_tasks`, which cancels again until the task ends or a deadline passes.

- `stop_tasks` ends a task that swallows a cancellation, and gives up on one that
  swallows every cancellation by its deadline;
- a proxy (keys required, admin API on: the stats flush and the revocation watch run)
  stopped while a summary made ahead is held at the upstream and an agent's turn waits
  for it at the crossing stops within a few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from typing import Any

import anthropic
import pytest

from proxy.server.app import start
from proxy.server.lifecycle import LIFECYCLE
from proxy.server.tasks import stop_tasks
from proxy.store import Store
from proxy.store.accounts import Accounts
from proxy.testing.agent import run_agent
from proxy.testing.standin import StandInOptions
from tests.server.conftest import (
    ADMIN_KEY_ENV,
    SMALL_WINDOW,
    SMALL_WINDOW_POLICY,
    UPSTREAM_KEY_ENV,
    proxy_settings,
)

PURPOSE = "x-compaction-proxy-purpose"


async def _stubborn(swallow: int, mercy: list[bool]) -> None:
    """A loop that takes `swallow` cancellations for timeouts and goes on, as a flush
    loop does when its store call turned the cancellation into a StoreUnavailable (until
    `mercy` holds something)."""
    left = swallow
    while True:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if left == 0 or mercy:
                raise
            left -= 1


async def test_stop_tasks_ends_a_task_that_swallowed_its_cancellation() -> None:
    task = asyncio.create_task(_stubborn(3, []))
    await asyncio.sleep(0.1)  # running: a task cancelled before its first step just ends
    began = time.monotonic()
    assert await stop_tasks([task], deadline=5.0)
    assert task.cancelled() and time.monotonic() - began < 1.0


async def test_stop_tasks_gives_up_at_its_deadline(caplog: pytest.LogCaptureFixture) -> None:
    mercy: list[bool] = []
    task = asyncio.create_task(_stubborn(10**9, mercy), name="never-stops")
    await asyncio.sleep(0.1)
    began = time.monotonic()
    assert not await stop_tasks([task], deadline=0.5)
    assert 0.4 < time.monotonic() - began < 1.5
    assert "never-stops" in caplog.text and not task.done()
    mercy.append(True)
    assert await stop_tasks([task], deadline=1.0)


async def test_a_proxy_stops_promptly_while_a_turn_waits_for_a_summary_made_ahead(
    make_standin: Any, redis_url: str, redis_key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = asyncio.Event()  # never opened: the summary made ahead stays at the upstream
    standin = await make_standin(
        StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None, summary_gate=gate)
    )
    monkeypatch.setenv(ADMIN_KEY_ENV, f"admin-{uuid.uuid4().hex}")
    monkeypatch.setenv(UPSTREAM_KEY_ENV, "sk-upstream-shutdown")
    settings = proxy_settings(
        standin.url,
        redis_url,
        **{
            "store.key_prefix": redis_key_prefix,
            "auth.keys": "required",
            "auth.admin_key_env": ADMIN_KEY_ENV,
            "auth.cache_seconds": 0.5,
        },
    )
    settings = dataclasses.replace(settings, policies=(SMALL_WINDOW_POLICY,))
    store = Store.from_url(redis_url, prefix=redis_key_prefix, op_timeout=5.0)
    key, _ = await Accounts(store).create_key(team="shutdown", upstream_env=UPSTREAM_KEY_ENV)
    await store.close()
    proxy = await start(settings)
    stopped = False
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key=key, max_retries=0)
    agent = asyncio.create_task(
        run_agent(client, turns=40, result_chars=3_000, conversation=uuid.uuid4().hex)
    )
    try:
        # Wait until a summary is held at the upstream and a turn has waited on it for a
        # while (the agent makes no progress, one request in flight).
        deadline = time.monotonic() + 60
        waiting_since: float | None = None
        seen = 0
        while True:
            if time.monotonic() > deadline:
                kinds = [r.headers.get(PURPOSE, "turn") for r in standin.recorded]
                raise AssertionError(
                    f"no turn ever waited: {kinds[-8:]}, {len(kinds)} requests,"
                    f" in flight {proxy.app[LIFECYCLE].in_flight}"
                )
            assert not agent.done(), agent.exception() if agent.done() else None
            held = [
                r
                for r in standin.recorded
                if r.headers.get(PURPOSE) == "summary" and r.outcome == "open"
            ]
            busy = proxy.app[LIFECYCLE].in_flight > 0
            if held and busy and len(standin.recorded) == seen:
                waiting_since = waiting_since or time.monotonic()
                if time.monotonic() - waiting_since > 1.5:
                    break
            else:
                waiting_since = None
            seen = len(standin.recorded)
            await asyncio.sleep(0.1)
        began = time.monotonic()
        await proxy.stop()
        stopped = True
        took = time.monotonic() - began
        assert took < 8.0, f"stopping took {took:.1f} s"
    finally:
        if not stopped:
            await proxy.stop()
        agent.cancel()
        with contextlib.suppress(BaseException):
            await agent
        await client.close()
        gate.set()
