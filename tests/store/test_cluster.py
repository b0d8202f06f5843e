"""The same Store against a three-master Redis Cluster: one conversation, one slot."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
import redis
from redis.crc import key_slot

from proxy.store import Store
from proxy.store.keys import scan_pattern


@pytest.fixture
async def cluster_store(
    make_store: Callable[..., Store], redis_cluster_url: str
) -> AsyncIterator[Store]:
    yield make_store(redis_cluster_url)


def node_of_each_key(cluster_url: str, prefix: str) -> dict[str, int]:
    """Which master (by port) holds each key under ``prefix``."""
    client = redis.RedisCluster.from_url(cluster_url.split("?")[0])
    try:
        placement = {}
        for node in client.get_primaries():
            for key in node.redis_connection.scan_iter(match=scan_pattern(prefix)):
                placement[key.decode()] = node.port
        return placement
    finally:
        client.close()


async def test_url_option_selects_the_cluster_client(cluster_store: Store) -> None:
    assert cluster_store.is_cluster
    assert await cluster_store.ping() is True


async def test_every_operation_works_on_a_cluster(
    cluster_store: Store, redis_cluster_url: str
) -> None:
    conversations = [f"conv{i}" for i in range(24)]
    for conversation in conversations:
        store = cluster_store
        # Blobs live in the tenant's 16 bucket slots: a crossing's write and a refresh
        # span several nodes.
        blobs = [("ref", "0123456789"), ("ref2", "x"), (f"own-{conversation}", "y")]
        saved = await store.save_crossing(
            "t", conversation, root="current", checkpoint={"c": conversation}, blobs=blobs,
            summary=None, touch=[],
        )  # fmt: skip
        assert saved.complete, saved
        store.blob_cache.clear()  # read from the cluster, not this replica's cache
        assert await store.read_blob("t", conversation, "ref") == "0123456789"
        assert await store.touch_refs("t", conversation, ["ref", "ref2", "no"]) == ("no",)
        state = await store.load_conversation("t", conversation, "current")
        assert state.checkpoint == {"c": conversation}
        await store.put_json("t", conversation, "summary", "current", "a summary")
        # One script over several keys of the conversation: legal, they share a slot.
        assert await store.refresh_ttl("t", conversation, "summary", ["current", "no"]) == 1
        token = await store.acquire_lock("t", conversation, "summary", 10_000)
        assert token is not None
        assert await store.acquire_lock("t", conversation, "summary", 10_000) is None
        assert await store.release_lock("t", conversation, "summary", token) is True
    for model in ("model-a", "model-b", "model-c"):
        assert await cluster_store.update_global_mean("calibration-mean", model, 1.5) == (1.5, 1)
        assert await cluster_store.get_global_mean("calibration-mean", model) == (1.5, 1)

    placement = node_of_each_key(redis_cluster_url, cluster_store.prefix)
    # Every key of one conversation sits on one node (one slot); the fleet's
    # conversations spread over all three masters.
    for conversation in conversations:
        tagged = {k: n for k, n in placement.items() if f"{{t:{conversation}}}" in k}
        assert len(tagged) == 2  # the lines and the summary; the lock was released
        assert len({key_slot(k.encode()) for k in tagged}) == 1
        assert len(set(tagged.values())) == 1
    # The tenant's blobs are stored once each, whichever conversations wrote them, and
    # spread over its bucket slots on every master.
    blobs = {k: n for k, n in placement.items() if ":blob:" in k}
    assert len(blobs) == 2 + len(conversations)
    assert all("{t/" in k for k in blobs)
    assert len(set(blobs.values())) == 3
    assert len(set(placement.values())) == 3
