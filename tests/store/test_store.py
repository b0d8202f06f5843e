"""The store against a real Redis: blobs, JSON, TTLs, locks, running means."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from proxy.store import Store, keys
from proxy.store.keys import scan_pattern

T, C = "tenant0", "conv0"


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def keys_under(raw: redis.asyncio.Redis, prefix: str) -> list[bytes]:
    return [key async for key in raw.scan_iter(match=scan_pattern(prefix))]


async def test_ping(store: Store) -> None:
    assert await store.ping() is True


async def save_blobs(store: Store, *blobs: tuple[str, str], tenant: str = T) -> None:
    saved = await store.save_crossing(
        tenant, C, root="s", checkpoint=None, blobs=blobs, summary=None, touch=[]
    )
    assert saved.complete, saved


async def test_blob_round_trip_and_isolation(store: Store) -> None:
    text = "".join(map(chr, range(0x3000))) * 20  # every width of UTF-8, control characters
    await save_blobs(store, ("ref1", text))
    for cached in (True, False):
        if not cached:
            store.blob_cache.clear()  # the same answers from Redis
        assert await store.read_blob(T, C, "ref1") == text
        # Blobs are stored once per tenant: every conversation of the tenant reads it,
        # another tenant never does (the same answer as a missing ref).
        assert await store.read_blob(T, "conv1", "ref1") == text
        assert await store.read_blob("tenant1", C, "ref1") is None
        assert await store.read_blob(T, C, "nope") is None


async def test_missing_and_empty_blobs_differ(store: Store) -> None:
    await save_blobs(store, ("empty", ""))
    store.blob_cache.clear()
    assert await store.read_blob(T, C, "empty") == ""
    assert await store.read_blob(T, C, "missing") is None


async def test_json_round_trip(store: Store) -> None:
    value = {"prefix_end": 12, "hash": "ab12", "stubs": ["r1", "r2"], "ok": True, "x": None}
    await store.put_json(T, C, "checkpoint", "current", value)
    assert await store.get_json(T, C, "checkpoint", "current") == value
    assert await store.get_json(T, C, "checkpoint", "other") is None
    assert await store.get_json(T, C, "summary", "current") is None
    await store.put_json(T, C, "checkpoint", "current", [1, 2.5, "three"])
    assert await store.get_json(T, C, "checkpoint", "current") == [1, 2.5, "three"]


async def test_undecodable_json_reads_as_missing(store: Store, raw: redis.asyncio.Redis) -> None:
    await store.put_json(T, C, "checkpoint", "c", {"a": 1})
    (key,) = await keys_under(raw, store.prefix)
    await raw.set(key, b"{not json", keepttl=True)
    assert await store.get_json(T, C, "checkpoint", "c") is None


async def test_every_write_sets_a_ttl(store: Store, raw: redis.asyncio.Redis) -> None:
    saved = await store.save_crossing(
        T, C, root="c", checkpoint={"a": 1}, blobs=[("r", "data")], summary=("sum", "text"),
        touch=[],
    )  # fmt: skip
    assert saved.complete
    await store.put_json(T, C, "summary", "s", "text", ttl=120)
    await store.update_global_mean("calibration-mean", "m", 1.1)
    assert await store.acquire_lock(T, C, "summarise", 5000) is not None
    found = await keys_under(raw, store.prefix)
    assert len(found) == 6
    ttls = {key.decode(): await raw.pttl(key) for key in found}
    assert all(ttl > 0 for ttl in ttls.values()), ttls
    assert all(ttl <= 7 * 86400 * 1000 for ttl in ttls.values()), ttls
    by_suffix = {key.rsplit(":", 1)[-1]: ttl for key, ttl in ttls.items()}
    assert 115_000 < by_suffix["s"] <= 120_000
    assert by_suffix["summarise"] <= 5000
    assert all(by_suffix[k] > 6 * 86400 * 1000 for k in ("r", "c", "sum"))


async def test_default_ttl_is_configurable(make_store, raw: redis.asyncio.Redis) -> None:
    short = make_store(default_ttl=30)
    saved = await short.save_crossing(
        T, C, root="c", checkpoint={"a": 1}, blobs=[("r", "x")], summary=("sum", "text"),
        touch=[],
    )  # fmt: skip
    assert saved.complete
    found = await keys_under(raw, short.prefix)
    assert len(found) == 3
    ttls = [await raw.pttl(key) for key in found]
    assert all(25_000 < ttl <= 30_000 for ttl in ttls), ttls


@pytest.mark.parametrize("ttl", [0, -5])
async def test_non_positive_ttl_is_rejected(store: Store, make_store, ttl: int) -> None:
    with pytest.raises(ValueError, match="ttl"):
        await store.put_json(T, C, "checkpoint", "c", 1, ttl=ttl)
    with pytest.raises(ValueError, match="default_ttl"):
        make_store(default_ttl=ttl)


async def test_ttl_must_be_whole_seconds(store: Store, make_store) -> None:
    with pytest.raises(TypeError, match="ttl"):
        await store.put_json(T, C, "checkpoint", "c", 1, ttl=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="default_ttl"):
        make_store(default_ttl=86400.0)


async def test_keys_carry_prefix_and_hash_tag(store: Store, raw: redis.asyncio.Redis) -> None:
    saved = await store.save_crossing(
        T, C, root="c", checkpoint={}, blobs=[("ref9", "x")], summary=None, touch=[]
    )
    assert saved.complete
    await store.update_global_mean("calibration", "m", 1.0)
    found = sorted(k.decode() for k in await keys_under(raw, store.prefix))
    blob = keys.blob_key(store.prefix, T, "ref9")
    assert found == [
        f"{store.prefix}g:calibration:m",
        blob,
        f"{store.prefix}{{{T}:{C}}}:lines:c",
    ]
    assert blob.startswith(f"{store.prefix}{{{T}/") and blob.endswith("}:blob:ref9")


async def test_lock_is_exclusive_across_stores(make_store) -> None:
    replica_a, replica_b = make_store(), make_store()
    token = await replica_a.acquire_lock(T, C, "summary:abc", 10_000)
    assert token is not None
    assert await replica_b.acquire_lock(T, C, "summary:abc", 10_000) is None
    # A different lock name or conversation is independent.
    other = await replica_b.acquire_lock(T, C, "summary:def", 10_000)
    assert other is not None
    assert await replica_b.acquire_lock(T, "conv1", "summary:abc", 10_000) is not None
    # Only the holder's token releases it.
    assert await replica_b.release_lock(T, C, "summary:abc", "not-the-token") is False
    assert await replica_b.acquire_lock(T, C, "summary:abc", 10_000) is None
    assert await replica_a.release_lock(T, C, "summary:abc", token) is True
    assert await replica_a.release_lock(T, C, "summary:abc", token) is False
    token_b = await replica_b.acquire_lock(T, C, "summary:abc", 10_000)
    assert token_b is not None and token_b != token
    # The old holder's token cannot release the new holder's lock.
    assert await replica_a.release_lock(T, C, "summary:abc", token) is False
    assert await replica_a.acquire_lock(T, C, "summary:abc", 10_000) is None


async def test_expired_lock_can_be_taken_again(store: Store, raw: redis.asyncio.Redis) -> None:
    assert await store.acquire_lock(T, C, "l", 60_000) is not None
    (key,) = await keys_under(raw, store.prefix)
    await raw.delete(key)  # what expiry does, without waiting for it
    assert await store.acquire_lock(T, C, "l", 60_000) is not None


async def test_running_mean(store: Store) -> None:
    assert await store.get_global_mean("calibration", "m") is None
    assert await store.update_global_mean("calibration", "m", 1.0) == (1.0, 1)
    assert await store.update_global_mean("calibration", "m", 2.0) == (1.5, 2)
    mean, count = await store.update_global_mean("calibration", "m", 3.0)
    assert (mean, count) == (pytest.approx(2.0), 3)
    assert await store.get_global_mean("calibration", "m") == (mean, 3)


async def test_running_mean_caps_its_sample_count(store: Store) -> None:
    for _ in range(5):
        await store.update_global_mean("calibration", "m", 1.0, max_samples=4)
    mean, count = await store.update_global_mean("calibration", "m", 5.0, max_samples=4)
    # Past the cap each new sample weighs 1/cap: 1 + (5 - 1) / 4.
    assert (mean, count) == (pytest.approx(2.0), 4)


async def test_running_mean_folds_several_samples_in_one_call_as_one_by_one(
    store: Store,
) -> None:
    samples = [1.0, 5.0, 2.5, 0.75, 3.0, 1.25]
    for one in samples[:3]:
        await store.update_global_mean("calibration", "single", one, max_samples=4)
    alone = await store.update_global_mean("calibration", "single", samples[3], max_samples=4)
    for one in samples[4:]:
        alone = await store.update_global_mean("calibration", "single", one, max_samples=4)
    together = await store.update_global_mean("calibration", "many", samples[:4], max_samples=4)
    together = await store.update_global_mean("calibration", "many", samples[4:], max_samples=4)
    assert together == alone
    assert together[1] == 4
    with pytest.raises(ValueError):
        await store.update_global_mean("calibration", "many", [1.0, float("nan")])
    with pytest.raises(ValueError):
        await store.update_global_mean("calibration", "many", [])


async def test_running_mean_keeps_full_precision(store: Store) -> None:
    mean, _ = await store.update_global_mean("calibration", "m", 1.2345678901234567)
    assert mean == 1.2345678901234567


async def test_running_mean_is_atomic_under_concurrency(make_store) -> None:
    # A generous timeout: this checks atomicity, not speed (on a loaded machine 100 calls
    # at once can take longer than the default half second).
    replicas = [make_store(op_timeout=10.0) for _ in range(4)]
    await asyncio.gather(
        *(r.update_global_mean("calibration", "m", 2.0, max_samples=1000) for r in replicas * 25)
    )
    assert await replicas[0].get_global_mean("calibration", "m") == (2.0, 100)


@pytest.mark.parametrize("sample", [float("nan"), float("inf")])
async def test_running_mean_rejects_non_finite(store: Store, sample: float) -> None:
    with pytest.raises(ValueError, match="finite"):
        await store.update_global_mean("calibration", "m", sample)


async def test_invalid_ids_raise_before_any_io(store: Store) -> None:
    with pytest.raises(ValueError, match="tenant"):
        await save_blobs(store, ("r", "x"), tenant="bad tenant")
    with pytest.raises(ValueError, match="tenant"):
        await store.read_blob("bad tenant", C, "r")
    with pytest.raises(ValueError, match="tenant"):
        await store.touch_refs("bad tenant", C, ["r"])
    with pytest.raises(ValueError, match="conversation"):
        await store.get_json(T, "{conv}", "checkpoint", "c")


async def test_more_concurrent_calls_than_connections_wait_instead_of_failing(
    make_store,
) -> None:
    # redis-py's default pool raises "Too many connections" past its size; a burst of
    # requests must queue for a connection instead (the generous timeout keeps a slow
    # machine from turning the wait into StoreUnavailable). No blob cache: every read
    # goes to Redis.
    store = make_store(max_connections=4, op_timeout=10.0, blob_cache_chars=0)
    await save_blobs(store, ("r", "0123456789"))
    replies = await asyncio.gather(*(store.read_blob(T, C, "r") for _ in range(500)))
    assert replies == ["0123456789"] * 500


async def test_refresh_ttl_renews_existing_keys_of_one_conversation(
    store: Store, raw: redis.asyncio.Redis
) -> None:
    await store.put_json(T, C, "summary", "s1", "one", ttl=60)
    await store.put_json(T, C, "summary", "s2", "two", ttl=60)
    assert await store.refresh_ttl(T, C, "summary", ["s1", "s2", "gone"], ttl=3600) == 2
    assert await store.refresh_ttl(T, C, "summary", []) == 0
    ttls = [await raw.pttl(key) for key in await keys_under(raw, store.prefix)]
    assert len(ttls) == 2
    assert all(3_500_000 < ttl <= 3_600_000 for ttl in ttls)
    assert await store.get_json(T, C, "summary", "gone") is None  # never creates a key


async def test_touch_refs_renews_existing_blobs(make_store, raw: redis.asyncio.Redis) -> None:
    short, long = make_store(default_ttl=60), make_store(default_ttl=3600)
    await save_blobs(short, ("old1", "x"), ("old2", "y"))
    assert await long.touch_refs(T, C, ["old1", "old2", "gone"]) == ("gone",)
    assert await long.touch_refs(T, C, []) == ()
    ttls = [await raw.pttl(key) for key in await keys_under(raw, long.prefix)]
    assert len(ttls) == 2
    assert all(3_500_000 < ttl <= 3_600_000 for ttl in ttls)
    assert await long.read_blob(T, C, "gone") is None  # refreshing never creates a key
