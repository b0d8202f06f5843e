"""Real Redis for tests: the system one when REDIS_URL is set, else an embedded server.

Fixtures:
- ``redis_url`` (session): a URL every test may use; with REDIS_URL the server is shared,
  so everything a session writes lives under ``redis_session_prefix`` and is deleted at
  the end.
- ``redis_key_prefix``: a prefix unique to one test, its keys deleted afterwards.
- ``store``: a ``Store`` on ``redis_url`` with that prefix; ``make_store``: more of them
  (same prefix by default, e.g. two replicas sharing state).
- ``embedded_redis``: a factory of private, started ``EmbeddedRedis`` servers a test may
  stop and start again on the same socket ("Redis down" tests); stopped at teardown.
- ``redis_cluster_url`` (session): a private three-master Redis Cluster on loopback
  ports (``?cluster=1`` URL), started on first use.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from proxy.store import EmbeddedRedis, Store
from proxy.store.keys import scan_pattern
from tests.plugins.redis_cluster import LocalRedisCluster


def delete_keys(url: str, prefix: str) -> int:
    """Delete every key under ``prefix`` (SCAN + DEL); returns how many."""
    client = redis.Redis.from_url(url)
    try:
        deleted = 0
        batch: list[bytes] = []
        for key in client.scan_iter(match=scan_pattern(prefix), count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += client.delete(*batch)
                batch.clear()
        if batch:
            deleted += client.delete(*batch)
        return deleted
    finally:
        client.close()


@pytest.fixture(scope="session")
def redis_session_prefix() -> str:
    return f"cptest:{uuid.uuid4().hex}:"


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory, redis_session_prefix: str) -> Iterator[str]:
    shared = os.environ.get("REDIS_URL")
    if shared:
        try:
            yield shared
        finally:
            delete_keys(shared, redis_session_prefix)
        return
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    server.start_sync()
    try:
        yield server.url
    finally:
        server.stop_sync()


@pytest.fixture
def redis_key_prefix(redis_url: str, redis_session_prefix: str) -> Iterator[str]:
    prefix = f"{redis_session_prefix}{uuid.uuid4().hex[:12]}:"
    yield prefix
    delete_keys(redis_url, prefix)


@pytest.fixture
async def make_store(redis_url: str, redis_key_prefix: str) -> AsyncIterator[Callable[..., Store]]:
    made: list[Store] = []

    def make(url: str | None = None, **options: Any) -> Store:
        options.setdefault("prefix", redis_key_prefix)
        made.append(Store.from_url(url or redis_url, **options))
        return made[-1]

    yield make
    for store in made:
        await store.close()


@pytest.fixture
async def store(make_store: Callable[..., Store]) -> Store:
    return make_store()


@pytest.fixture
def embedded_redis(tmp_path: Path) -> Iterator[Callable[[], EmbeddedRedis]]:
    servers: list[EmbeddedRedis] = []

    def start() -> EmbeddedRedis:
        server = EmbeddedRedis(tmp_path / f"redis-{len(servers)}")
        servers.append(server)
        server.start_sync()
        return server

    yield start
    for server in servers:
        server.stop_sync()


@pytest.fixture(scope="session")
def redis_cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    cluster = LocalRedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()
