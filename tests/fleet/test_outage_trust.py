"""The outage trust horizon (issue 21, finding 4), through a real `serve` replica with a
private Redis it kills.

With `budgets.on_store_down = "open"`, a key the replica knew valid kept working only
`auth.cache_seconds` (5 s) into an outage: "open" was "closed" for a keyed fleet. Now it
keeps working `auth.outage_trust_seconds` into the outage, while a key revoked just
before the outage stops within `cache_seconds` (the revocation reached the replica as it
was made), and past the horizon every key is refused again.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from proxy.store import EmbeddedRedis
from proxy.store.accounts import Accounts
from proxy.testing.standin import StandInOptions
from tests.fleet.test_fleet import Fleet, new_key, start_replicas, with_accounts
from tests.fleet.test_outages import answer_status, kill
from tests.plugins.redis import delete_keys
from tests.plugins.standin import RunningStandIn


def test_a_known_key_keeps_working_into_an_outage_and_a_revoked_one_stops(
    tmp_path: Path,
    embedded_redis: Callable[[], EmbeddedRedis],
    make_standin_thread: Callable[[StandInOptions], RunningStandIn],
) -> None:
    server = embedded_redis()
    standin = make_standin_thread(StandInOptions(max_recorded=None))
    fleet = Fleet([], standin, server.url, "cptrust:")
    kept, _ = new_key(fleet, "kept")
    revoked, revoked_id = new_key(fleet, "revoked")
    extra = '[budgets]\non_store_down = "open"\n'
    auth = '[auth]\nkeys = "required"\ncache_seconds = 1.0\noutage_trust_seconds = 4.0\n'
    (replica,) = start_replicas(tmp_path, 1, standin.url, server.url, "cptrust:", extra, auth=auth)
    redis.Redis.from_url(server.url).config_set("appendfsync", "always")
    try:
        assert answer_status(replica.url, kept) == 200
        time.sleep(1.2)  # past cache_seconds: checked again below, the watch listening
        assert answer_status(replica.url, kept) == 200  # both known to the replica
        assert answer_status(replica.url, revoked) == 200

        async def revoke(accounts: Accounts) -> bool:
            return await accounts.revoke_key(revoked_id)

        assert asyncio.run(with_accounts(fleet, revoke))
        # The revocation's message reaches the replica's watch in well under a second even
        # on a loaded machine; then Redis goes: no request of the replica saw the
        # revocation in Redis, only the watch did.
        time.sleep(0.5)
        kill(server)
        outage = time.monotonic()
        time.sleep(1.5)  # past auth.cache_seconds
        assert answer_status(replica.url, revoked) == 503  # revoked before the outage: stopped
        assert answer_status(replica.url, kept) == 200  # known: trusted into the outage
        time.sleep(max(0.0, outage + 5.0 - time.monotonic()))  # past the horizon
        assert answer_status(replica.url, kept) == 503
        server.start_sync()
        deadline = time.monotonic() + 20
        while answer_status(replica.url, kept) != 200:  # checked again once Redis answers
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert answer_status(replica.url, revoked) == 401
    finally:
        replica.stop()


def test_without_the_watch_a_key_is_not_trusted_past_cache_seconds(
    tmp_path: Path,
    embedded_redis: Callable[[], EmbeddedRedis],
    make_standin_thread: Callable[[StandInOptions], RunningStandIn],
) -> None:
    """outage_trust_seconds = 0 keeps the old rule: a key that cannot be checked again
    is refused after cache_seconds."""
    server = embedded_redis()
    standin = make_standin_thread(StandInOptions(max_recorded=None))
    fleet = Fleet([], standin, server.url, "cpnotrust:")
    key, _ = new_key(fleet, "kept")
    extra = '[budgets]\non_store_down = "open"\n'
    auth = '[auth]\nkeys = "required"\ncache_seconds = 1.0\noutage_trust_seconds = 0\n'
    (replica,) = start_replicas(
        tmp_path, 1, standin.url, server.url, "cpnotrust:", extra, auth=auth
    )
    try:
        assert answer_status(replica.url, key) == 200
        kill(server)
        time.sleep(1.5)
        assert answer_status(replica.url, key) == 503
    finally:
        replica.stop()


@pytest.fixture(params=["standalone", "cluster"])
def shared_redis(request: pytest.FixtureRequest) -> str:
    name = "redis_cluster_url" if request.param == "cluster" else "redis_url"
    return str(request.getfixturevalue(name))


def test_a_revocation_reaches_every_replica_as_it_is_made(
    tmp_path: Path,
    shared_redis: str,
    make_standin_thread: Callable[[StandInOptions], RunningStandIn],
) -> None:
    """The revocation watch, on a standalone Redis and on a Cluster (it listens on the
    start-up node; a PUBLISH reaches every node): with key records cached for 30 s, a
    revoked key is refused by both replicas at once, not 30 s later."""
    standin = make_standin_thread(StandInOptions(max_recorded=None))
    prefix = f"cpwatch:{uuid.uuid4().hex[:8]}:"
    fleet = Fleet([], standin, shared_redis, prefix)
    key, key_id = new_key(fleet, "watched")
    auth = '[auth]\nkeys = "required"\ncache_seconds = 30\n'
    replicas = start_replicas(tmp_path, 2, standin.url, shared_redis, prefix, auth=auth)
    try:
        assert [answer_status(r.url, key) for r in replicas] == [200, 200]  # cached for 30 s
        time.sleep(1.0)  # both watches listening

        async def revoke(accounts: Accounts) -> bool:
            return await accounts.revoke_key(key_id)

        assert asyncio.run(with_accounts(fleet, revoke))
        deadline = time.monotonic() + 3.0
        while [answer_status(r.url, key) for r in replicas] != [401, 401]:
            assert time.monotonic() < deadline, "the revocation did not reach the replicas"
            time.sleep(0.1)
    finally:
        for replica in replicas:
            replica.stop()
        if "cluster=1" not in shared_redis:
            delete_keys(shared_redis, prefix)
