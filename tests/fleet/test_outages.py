"""Budgets and keys when Redis stalls or goes away, through real `serve` replicas, each
test with a private Redis it pauses, kills and restarts.

- A stall shorter than `budgets.timeout` only delays: nothing is admitted uncounted.
- Failing open admits at most `budgets.outage_allowance` per key and replica, exports it,
  and charges what was admitted once Redis is back.
- A key revoked just before Redis goes away stops within `auth.cache_seconds`, on a
  fail-open replica as on a fail-closed one.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import pytest
import redis

from proxy.core.tokens import default_counter
from proxy.store import EmbeddedRedis
from proxy.store.accounts import Accounts, Scope
from proxy.testing.standin import StandInOptions
from tests.fleet.test_fleet import (
    REQUEST,
    Fleet,
    metric,
    new_key,
    quiet_usage,
    settled_usage,
    start_replicas,
    with_accounts,
)
from tests.plugins.standin import RunningStandIn

# The answer runs to max_tokens, so what a request reports is what it reserved.
LONG = {"x-stand-in": '{"text": "' + "word " * 400 + '"}'}


def kill(server: EmbeddedRedis) -> None:
    assert server.pid is not None
    os.kill(server.pid, signal.SIGKILL)
    server.stop_sync()


async def _burst(urls: list[str], key: str, count: int) -> list[Any]:
    clients = [anthropic.AsyncAnthropic(base_url=u, api_key=key, max_retries=0) for u in urls]

    async def one(n: int) -> Any:
        try:
            return await clients[n % len(clients)].messages.create(**REQUEST, extra_headers=LONG)
        except anthropic.APIStatusError as e:
            return e

    try:
        return await asyncio.gather(*(one(n) for n in range(count)))
    finally:
        for c in clients:
            await c.close()


def test_a_redis_stall_delays_budgets_it_does_not_open_them(
    tmp_path: Path,
    embedded_redis: Callable[[], EmbeddedRedis],
    make_standin_thread: Callable[[StandInOptions], RunningStandIn],
) -> None:
    """With the defaults (on_store_down = "open"), an 800 ms stall during a burst of 60
    admitted 6,000 tokens against a 2,000 limit, 1 counted (finding 4): the store's
    0.5 s timeout took the stall for an outage. Budget calls now wait budgets.timeout."""
    server = embedded_redis()
    standin = make_standin_thread(StandInOptions(max_recorded=None))
    fleet = Fleet([], standin, server.url, "cpstall:")
    limit = 20 * REQUEST["max_tokens"]
    key, key_id = new_key(fleet, "stall", **{"day:output": limit})
    auth = '[auth]\nkeys = "required"\ncache_seconds = 30\n'  # keys stay cached meanwhile
    fleet.replicas = start_replicas(tmp_path, 2, standin.url, server.url, "cpstall:", auth=auth)
    try:
        for url in fleet.urls:  # warm: keys and limits cached, pools open
            with anthropic.Anthropic(base_url=url, api_key=key, max_retries=0) as client:
                client.messages.create(**{**REQUEST, "max_tokens": 1})
        warm = quiet_usage(fleet, Scope("key", key_id))["output"]
        pauser = redis.Redis.from_url(server.url)
        pauser.execute_command("CLIENT", "PAUSE", 800, "ALL")
        results = asyncio.run(_burst(fleet.urls, key, 60))
        pauser.close()
        admitted = [r for r in results if not isinstance(r, Exception)]
        refused = [r for r in results if isinstance(r, anthropic.RateLimitError)]
        assert len(admitted) + len(refused) == 60, [r for r in results if r not in admitted]
        spent = sum(m.usage.output_tokens for m in admitted)
        # Each answer runs to about its max_tokens: admitting all 60 would spend 3x the limit.
        assert min(m.usage.output_tokens for m in admitted) > REQUEST["max_tokens"] // 2
        assert warm + spent <= limit  # the bound holds through the stall
        assert settled_usage(fleet, Scope("key", key_id), lambda d: d["output"] == warm + spent)
        for url in fleet.urls:  # exported, and nothing went uncounted
            exported = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
            assert "compaction_proxy_budget_admitted_uncounted_total 0.0" in exported
            assert "compaction_proxy_budget_store_outages_total 0.0" in exported
    finally:
        for replica in fleet.replicas:
            replica.stop()
    assert "fleet store unreachable" not in "".join(r.log.read_text() for r in fleet.replicas)


def _status(url: str, key: str, outputs: list[int] | None = None) -> int:
    try:
        with anthropic.Anthropic(base_url=url, api_key=key, max_retries=0) as client:
            message = client.messages.create(**REQUEST, extra_headers=LONG)
    except anthropic.APIStatusError as e:
        return e.status_code
    if outputs is not None:
        outputs.append(message.usage.output_tokens)
    return 200


def test_failing_open_admits_at_most_the_allowance_and_charges_it_later(
    tmp_path: Path,
    embedded_redis: Callable[[], EmbeddedRedis],
    make_standin_thread: Callable[[StandInOptions], RunningStandIn],
) -> None:
    """Uncounted admissions were unbounded and never exported (finding 4)."""
    server = embedded_redis()
    standin = make_standin_thread(StandInOptions(max_recorded=None))
    fleet = Fleet([], standin, server.url, "cpopen:")
    key, key_id = new_key(fleet, "open", **{"day:output": 10**6})
    # A request reserves its input estimate and max_tokens: room for four of them.
    per_request = default_counter().count_request(REQUEST) + REQUEST["max_tokens"]
    allowance = 4 * per_request + per_request // 2
    extra = f'[budgets]\non_store_down = "open"\noutage_allowance = {allowance}\n'
    auth = '[auth]\nkeys = "required"\ncache_seconds = 30\n'
    (replica,) = start_replicas(tmp_path, 1, standin.url, server.url, "cpopen:", extra, auth=auth)
    fleet.replicas = [replica]
    try:
        assert _status(replica.url, key) == 200  # the key is cached
        before = quiet_usage(fleet, Scope("key", key_id))["output"]
        kill(server)
        outputs: list[int] = []
        statuses = [_status(replica.url, key, outputs) for _ in range(6)]
        assert statuses == [200, 200, 200, 200, 503, 503]
        assert metric(replica.url, "compaction_proxy_budget_admitted_uncounted_total") == 4
        assert metric(replica.url, "compaction_proxy_budget_store_unreachable") == 1
        assert metric(replica.url, "compaction_proxy_budget_store_outages_total") == 1
        server.start_sync()
        after: list[int] = []
        assert _status(replica.url, key, after) == 200  # Redis is back: the outage is charged
        (last,) = after
        # What the outage's requests reported, and the one after, is on the counters.
        expected = before + sum(outputs) + last
        assert settled_usage(fleet, Scope("key", key_id), lambda d: d["output"] == expected)
    finally:
        replica.stop()
    log = replica.log.read_text()
    assert log.count("fleet store unreachable") == 1  # one outage, logged once


def answer_status(url: str, key: str) -> int:
    request = urllib.request.Request(
        url + "/v1/messages",
        data=b'{"model": "claude-haiku-4-5", "max_tokens": 5, "messages": '
        b'[{"role": "user", "content": "hi"}]}',
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.parametrize("policy", ["open", "closed"])
def test_a_revoked_key_stops_within_cache_seconds_during_an_outage(
    tmp_path: Path,
    policy: str,
    embedded_redis: Callable[[], EmbeddedRedis],
    make_standin_thread: Callable[[StandInOptions], RunningStandIn],
) -> None:
    """A key revoked just before Redis went away kept working for the whole outage, on
    a fail-closed replica too (finding 12): its cached record was used however old."""
    server = embedded_redis()
    standin = make_standin_thread(StandInOptions(max_recorded=None))
    fleet = Fleet([], standin, server.url, "cprevoke:")
    key, key_id = new_key(fleet, "revoked")
    extra = f'[budgets]\non_store_down = "{policy}"\n'
    auth = '[auth]\nkeys = "required"\ncache_seconds = 1.0\n'
    (replica,) = start_replicas(tmp_path, 1, standin.url, server.url, "cprevoke:", extra, auth=auth)
    # The kill below is a SIGKILL: with fsync once a second (the default), a loaded
    # machine may postpone writing the revocation to the log and lose it.
    redis.Redis.from_url(server.url).config_set("appendfsync", "always")
    try:
        assert answer_status(replica.url, key) == 200  # cached on the replica

        async def revoke(accounts: Accounts) -> bool:
            return await accounts.revoke_key(key_id)

        assert asyncio.run(with_accounts(fleet, revoke))
        kill(server)  # before the replica could see the revocation
        time.sleep(1.5)  # past auth.cache_seconds
        assert answer_status(replica.url, key) == 503  # cannot be checked: not served
        server.start_sync()
        assert answer_status(replica.url, key) == 401
    finally:
        replica.stop()
