"""The store against a real Redis: blobs, slices, JSON, TTLs, locks, running means."""

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


async def test_blob_round_trip_and_isolation(store: Store) -> None:
    data = bytes(range(256)) * 1000
    await store.put_blob(T, C, "ref1", data)
    assert await store.get_blob(T, C, "ref1") == data
    # Blobs are stored once per tenant: every conversation of the tenant reads it,
    # another tenant never does (the same answer as a missing ref).
    assert await store.get_blob(T, "conv1", "ref1") == data
    assert await store.get_blob("tenant1", C, "ref1") is None
    assert await store.get_blob(T, C, "nope") is None


async def test_blob_slices(store: Store) -> None:
    await store.put_blob(T, C, "r", b"0123456789")
    assert await store.get_blob_slice(T, C, "r", 0, 4) == (b"0123", 10)
    assert await store.get_blob_slice(T, C, "r", 8, 100) == (b"89", 10)
    assert await store.get_blob_slice(T, C, "r", 9, 1) == (b"9", 10)
    assert await store.get_blob_slice(T, C, "r", 10, 5) == (b"", 10)
    assert await store.get_blob_slice(T, C, "r", 1000, 5) == (b"", 10)
    assert await store.get_blob_slice(T, C, "r", 3, 0) == (b"", 10)
    assert await store.get_blob_slice(T, C, "r", 0, 0) == (b"", 10)


async def test_slice_of_missing_and_empty_blobs_differ(store: Store) -> None:
    await store.put_blob(T, C, "empty", b"")
    assert await store.get_blob_slice(T, C, "empty", 0, 10) == (b"", 0)
    assert await store.get_blob_slice(T, C, "empty", 0, 0) == (b"", 0)
    assert await store.get_blob_slice(T, C, "missing", 0, 10) is None
    assert await store.get_blob_slice(T, C, "missing", 0, 0) is None


@pytest.mark.parametrize(("start", "length"), [(-1, 5), (0, -1), (-3, -3)])
async def test_negative_slice_bounds_are_rejected(store: Store, start: int, length: int) -> None:
    await store.put_blob(T, C, "r", b"0123456789")
    with pytest.raises(ValueError, match=">= 0"):
        await store.get_blob_slice(T, C, "r", start, length)


async def test_slices_cover_utf8_bytes_exactly(store: Store) -> None:
    text = "héllo wörld ✓".encode()
    await store.put_blob(T, C, "u", text)
    pieces = []
    for start in range(0, len(text), 3):
        piece, total = await store.get_blob_slice(T, C, "u", start, 3) or (b"", -1)
        assert total == len(text)
        pieces.append(piece)
    assert b"".join(pieces) == text


async def test_json_round_trip(store: Store) -> None:
    value = {"prefix_end": 12, "hash": "ab12", "stubs": ["r1", "r2"], "ok": True, "x": None}
    await store.put_json(T, C, "checkpoint", "current", value)
    assert await store.get_json(T, C, "checkpoint", "current") == value
    assert await store.get_json(T, C, "checkpoint", "other") is None
    assert await store.get_json(T, C, "summary", "current") is None
    await store.put_json(T, C, "checkpoint", "current", [1, 2.5, "three"])
    assert await store.get_json(T, C, "checkpoint", "current") == [1, 2.5, "three"]


async def test_global_json_round_trip(store: Store) -> None:
    await store.put_global_json("calibration", "claude-x", {"factor": 1.17})
    assert await store.get_global_json("calibration", "claude-x") == {"factor": 1.17}
    assert await store.get_global_json("calibration", "claude-y") is None


async def test_undecodable_json_reads_as_missing(store: Store, raw: redis.asyncio.Redis) -> None:
    await store.put_json(T, C, "checkpoint", "c", {"a": 1})
    (key,) = await keys_under(raw, store.prefix)
    await raw.set(key, b"{not json", keepttl=True)
    assert await store.get_json(T, C, "checkpoint", "c") is None


async def test_every_write_sets_a_ttl(store: Store, raw: redis.asyncio.Redis) -> None:
    await store.put_blob(T, C, "r", b"data")
    await store.put_blob(T, C, "r-short", b"data", ttl=60)
    await store.put_json(T, C, "checkpoint", "c", {"a": 1})
    await store.put_json(T, C, "summary", "s", "text", ttl=120)
    await store.put_global_json("calibration", "m", 1.0)
    await store.update_global_mean("calibration-mean", "m", 1.1)
    assert await store.acquire_lock(T, C, "summarise", 5000) is not None
    found = await keys_under(raw, store.prefix)
    assert len(found) == 7
    ttls = {key.decode(): await raw.pttl(key) for key in found}
    assert all(ttl > 0 for ttl in ttls.values()), ttls
    assert all(ttl <= 7 * 86400 * 1000 for ttl in ttls.values()), ttls
    by_suffix = {key.rsplit(":", 1)[-1]: ttl for key, ttl in ttls.items()}
    assert 55_000 < by_suffix["r-short"] <= 60_000
    assert 115_000 < by_suffix["s"] <= 120_000
    assert by_suffix["summarise"] <= 5000
    assert by_suffix["r"] > 6 * 86400 * 1000


async def test_default_ttl_is_configurable(make_store, raw: redis.asyncio.Redis) -> None:
    short = make_store(default_ttl=30)
    await short.put_blob(T, C, "r", b"x")
    (key,) = await keys_under(raw, short.prefix)
    assert 25_000 < await raw.pttl(key) <= 30_000


@pytest.mark.parametrize("ttl", [0, -5])
async def test_non_positive_ttl_is_rejected(store: Store, ttl: int) -> None:
    with pytest.raises(ValueError, match="ttl"):
        await store.put_blob(T, C, "r", b"x", ttl=ttl)


async def test_ttl_must_be_whole_seconds(store: Store, make_store) -> None:
    with pytest.raises(TypeError, match="ttl"):
        await store.put_json(T, C, "checkpoint", "c", 1, ttl=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="default_ttl"):
        make_store(default_ttl=86400.0)


async def test_keys_carry_prefix_and_hash_tag(store: Store, raw: redis.asyncio.Redis) -> None:
    await store.put_blob(T, C, "ref9", b"x")
    await store.put_global_json("calibration", "m", 1)
    found = sorted(k.decode() for k in await keys_under(raw, store.prefix))
    await store.put_json(T, C, "checkpoint", "c", {})
    found = sorted(k.decode() for k in await keys_under(raw, store.prefix))
    blob = keys.blob_key(store.prefix, T, "ref9")
    assert found == [
        f"{store.prefix}g:calibration:m",
        blob,
        f"{store.prefix}{{{T}:{C}}}:checkpoint:c",
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


async def test_lock_extend_checks_the_token(store: Store, raw: redis.asyncio.Redis) -> None:
    token = await store.acquire_lock(T, C, "l", 1000)
    assert token is not None
    assert await store.extend_lock(T, C, "l", "wrong", 60_000) is False
    assert await store.extend_lock(T, C, "l", token, 60_000) is True
    (key,) = await keys_under(raw, store.prefix)
    assert 55_000 < await raw.pttl(key) <= 60_000
    assert await store.release_lock(T, C, "l", token) is True
    assert await store.extend_lock(T, C, "l", token, 60_000) is False


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
        await store.put_blob("bad tenant", C, "r", b"x")
    with pytest.raises(ValueError, match="conversation"):
        await store.get_json(T, "{conv}", "checkpoint", "c")


async def test_more_concurrent_calls_than_connections_wait_instead_of_failing(
    make_store,
) -> None:
    # redis-py's default pool raises "Too many connections" past its size; a burst of
    # requests must queue for a connection instead (the generous timeout keeps a slow
    # machine from turning the wait into StoreUnavailable).
    store = make_store(max_connections=4, op_timeout=10.0)
    await store.put_blob(T, C, "r", b"0123456789")
    replies = await asyncio.gather(*(store.get_blob_slice(T, C, "r", 2, 3) for _ in range(500)))
    assert replies == [(b"234", 10)] * 500


async def test_refresh_ttl_renews_existing_keys_of_one_conversation(
    store: Store, raw: redis.asyncio.Redis
) -> None:
    await store.put_blob(T, C, "old1", b"x", ttl=60)
    await store.put_blob(T, C, "old2", b"y", ttl=60)
    assert await store.refresh_ttl(T, C, "blob", ["old1", "old2", "gone"], ttl=3600) == 2
    assert await store.refresh_ttl(T, C, "blob", []) == 0
    ttls = [await raw.pttl(key) for key in await keys_under(raw, store.prefix)]
    assert len(ttls) == 2
    assert all(3_500_000 < ttl <= 3_600_000 for ttl in ttls)
    assert await store.get_blob(T, C, "gone") is None  # refreshing never creates a key
