"""What the compaction executor calls, on a real Redis and on a real three-master Cluster:
a conversation's state in one read, a crossing in one write, blobs stored once per
tenant and compressed, refs that are gone reported, the Redis round trips counted."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
import redis
import redis.asyncio
from redis.asyncio import BlockingConnectionPool, Redis
from redis.crc import key_slot

from proxy.store import EmbeddedRedis, Store, keys
from proxy.store.keys import scan_pattern
from proxy.testing.agent import tool_output

T, C = "tenant0", "conv0"
CHECKPOINT = {"version": 1, "n": 4, "hash": "ab", "segments": [["m", 0], ["s", 1, []]]}


@pytest.fixture(params=["standalone", "cluster"])
def url(request: pytest.FixtureRequest) -> str:
    return str(
        request.getfixturevalue("redis_cluster_url" if request.param == "cluster" else "redis_url")
    )


@pytest.fixture
def store(url: str, make_store: Callable[..., Store]) -> Store:
    # What is tested is what gets stored, not how fast: room for a loaded machine.
    return make_store(url, op_timeout=5.0)


def raw_client(url: str) -> Any:
    if "cluster=1" in url:
        return redis.RedisCluster.from_url(url.split("?")[0])
    return redis.Redis.from_url(url)


def stored_keys(url: str, prefix: str) -> dict[str, int]:
    """Every key under `prefix` and the length of its value."""
    client = raw_client(url)
    try:
        found = {}
        nodes = client.get_primaries() if isinstance(client, redis.RedisCluster) else [None]
        for node in nodes:
            conn = node.redis_connection if node is not None else client
            for key in conn.scan_iter(match=scan_pattern(prefix)):
                # A root's lines are one hash: its length is its number of fields.
                string = conn.type(key) == b"string"
                found[key.decode()] = conn.strlen(key) if string else conn.hlen(key)
        return found
    finally:
        client.close()


async def test_a_crossing_is_read_back_whole(store: Store) -> None:
    text = tool_output(3, 20_000)
    state = await store.load_conversation(T, C, "slot1", summaries=["sum1"])
    assert state.checkpoint is None and state.summaries == {}
    saved = await store.save_crossing(
        T, C, root="slot1", checkpoint=CHECKPOINT, blobs=[("r_a", text), ("r_b", "short")],
        summary=("sum1", "the summary " * 200), touch=["r_a", "r_b"],
    )  # fmt: skip
    assert saved.complete and saved.lost == () and saved.error == ""
    state = await store.load_conversation(T, C, "slot1", summaries=["sum1", "sum2"])
    assert state.checkpoint == CHECKPOINT
    assert state.summaries == {"sum1": "the summary " * 200}
    assert (await store.load_conversation(T, C, "slot2")).checkpoint is None
    # The summariser's current path reads the same summary.
    assert await store.get_json(T, C, keys.SUMMARY, "sum1") == "the summary " * 200
    store.blob_cache.clear()  # read from Redis, not this replica's cache
    assert await store.read_blob(T, "another-conversation", "r_a") == text
    assert await store.read_blob(T, C, "r_b") == "short"
    assert await store.read_blob("tenant1", C, "r_a") is None  # foreign reads as missing
    assert await store.read_blob(T, C, "r_never") is None


async def test_a_crossing_without_checkpoint_or_summary(store: Store) -> None:
    saved = await store.save_crossing(
        T, C, root="s", checkpoint=None, blobs=[("r_x", "x" * 3000)], summary=None, touch=[]
    )
    assert saved.complete
    assert (await store.load_conversation(T, C, "s")).checkpoint is None
    saved = await store.save_crossing(
        T, C, root="s", checkpoint=None, blobs=[], summary=("k", "only a summary"), touch=[]
    )
    assert saved.complete
    assert (await store.load_conversation(T, C, "s", summaries=["k"])).summaries == {
        "k": "only a summary"
    }


async def test_a_load_decodes_each_stored_checkpoint_once(store: Store) -> None:
    decoded: list[object] = []

    def decode(raw: Any) -> object:
        decoded.append(raw)
        return None if raw.get("bad") else ("decoded", raw["n"])

    for line, checkpoint in (("a", CHECKPOINT), ("b", {**CHECKPOINT, "n": 5}), ("c", {"bad": 1})):
        saved = await store.save_crossing(
            T, C, root="s", checkpoint=checkpoint, blobs=[], summary=None, touch=[], line=line,
            used=ord(line),
        )  # fmt: skip
        assert saved.complete
    for _ in range(3):
        state = await store.load_conversation(T, C, "s", decode=decode)
        # Most recently used first; a line the decoder refuses is left out.
        assert state.lines == ((("decoded", 5), ord("b")), (("decoded", 4), ord("a")))
    assert len(decoded) == 3  # once per stored value, not per load
    assert (await store.load_conversation(T, C, "s")).checkpoint == {"bad": 1}  # no decoder


async def test_a_load_takes_the_checkpoint_its_crossing_saved_without_decoding_it(
    store: Store,
) -> None:
    decoded: list[object] = []

    def decode(raw: Any) -> object:
        decoded.append(raw)
        return ("decoded", raw["n"])

    kept = ("kept", 4)  # what decode makes of CHECKPOINT, made by the crossing
    saved = await store.save_crossing(
        T, C, root="s", checkpoint=CHECKPOINT, blobs=[], summary=None, touch=[], line="a",
        used=1, decoded=(decode, kept),
    )  # fmt: skip
    assert saved.complete
    for _ in range(2):
        state = await store.load_conversation(T, C, "s", decode=decode)
        assert state.lines == ((kept, 1),) and state.lines[0][0] is kept
    assert decoded == []
    # Another decoder is not given what this one was promised.
    assert (await store.load_conversation(T, C, "s", decode=dict)).checkpoint == CHECKPOINT


async def test_a_checkpoint_not_stored_is_not_kept(
    embedded_redis: Callable[[], EmbeddedRedis], make_store: Callable[..., Store]
) -> None:
    server = embedded_redis()
    store = make_store(server.url, op_timeout=5.0)
    client = redis.asyncio.Redis.from_url(server.url)
    try:
        await client.config_set("maxmemory-policy", "noeviction")
        await client.config_set("maxmemory", "1")  # every write is refused
        saved = await store.save_crossing(
            T, C, root="s", checkpoint=CHECKPOINT, blobs=[], summary=None, touch=[],
            decoded=(dict, {"never": "stored"}),
        )  # fmt: skip
        await client.config_set("maxmemory", "0")
        assert not saved.checkpoint
        # Stored now by another writer, the same bytes: decoded, not the promise.
        await client.hset(
            keys.conversation_key(store.prefix, T, C, keys.LINES, "s"),
            "c:_",
            orjson.dumps(CHECKPOINT),
        )
        assert (await store.load_conversation(T, C, "s", decode=dict)).checkpoint == CHECKPOINT
    finally:
        await client.aclose()


async def test_the_same_result_is_stored_once_per_tenant(
    url: str, make_store: Callable[..., Store]
) -> None:
    short = make_store(url, default_ttl=600, op_timeout=5.0)
    long = make_store(url, default_ttl=86_400, op_timeout=5.0)
    text = tool_output(7, 32_000)
    for conversation in ("c1", "c2", "c3"):
        saved = await short.save_crossing(
            T, conversation, root="s", checkpoint=CHECKPOINT, blobs=[("r_same", text)],
            summary=None, touch=[],
        )  # fmt: skip
        assert saved.complete
    await long.save_crossing(
        "tenant1", "c1", root="s", checkpoint=CHECKPOINT, blobs=[("r_same", text)],
        summary=None, touch=[],
    )  # fmt: skip
    found = stored_keys(url, short.prefix)
    blobs = sorted(k for k in found if ":blob:" in k)
    assert blobs == sorted(
        [keys.blob_key(short.prefix, T, "r_same"), keys.blob_key(short.prefix, "tenant1", "r_same")]
    )
    # Compressed: the scripted agent's build log takes far less than 0.3x its size.
    assert all(found[k] <= 0.3 * len(text) for k in blobs)
    # A conversation that still names the blob renews its life for everyone.
    client = raw_client(url)
    try:
        key = keys.blob_key(short.prefix, T, "r_same")
        assert client.ttl(key) <= 600
        assert await long.touch_refs(T, "c9", ["r_same"]) == ()
        assert client.ttl(key) > 80_000
    finally:
        client.close()


async def test_refs_whose_blobs_are_gone_are_reported(url: str, store: Store) -> None:
    unreadable: list[int] = []
    store.on_unreadable = unreadable.append
    await store.save_crossing(
        T, C, root="s", checkpoint=None, blobs=[("r_1", "one" * 100), ("r_2", "two" * 100)],
        summary=None, touch=[],
    )  # fmt: skip
    client = raw_client(url)
    try:
        client.delete(keys.blob_key(store.prefix, T, "r_1"))  # as an eviction would
    finally:
        client.close()
    assert await store.touch_refs(T, C, ["r_1", "r_2", "r_1"]) == ("r_1",)
    saved = await store.save_crossing(
        T, C, root="s", checkpoint=CHECKPOINT, blobs=[("r_3", "three")], summary=None,
        touch=["r_1", "r_2", "r_3"],
    )  # fmt: skip
    assert saved.lost == ("r_1",) and saved.checkpoint and saved.blobs
    store.blob_cache.clear()
    assert await store.read_blob(T, C, "r_1") is None
    assert await store.read_blob(T, C, "bad ref") is None
    assert await store.read_blob(T, C, "r_" + "0" * 500) is None
    assert sum(unreadable) == 5


async def test_values_without_a_codec_mark_stay_readable(url: str, store: Store) -> None:
    client = raw_client(url)
    try:
        client.set(keys.blob_key(store.prefix, T, "r_plain"), "plain text, as stored before")
        client.set(keys.blob_key(store.prefix, T, "r_bad"), b"\xffzcorrupt")
        client.set(keys.blob_key(store.prefix, T, "r_odd"), b"\xffQ??")
    finally:
        client.close()
    assert await store.read_blob(T, C, "r_plain") == "plain text, as stored before"
    assert await store.read_blob(T, C, "r_bad") is None
    assert await store.read_blob(T, C, "r_odd") is None


async def test_large_json_values_are_compressed(url: str, store: Store) -> None:
    big = {"segments": [["summary", "a long summary of what happened " * 100, 12]]}
    await store.put_json(T, C, keys.CHECKPOINT, "big", big)
    await store.put_json(T, C, keys.CHECKPOINT, "small", {"n": 1})
    assert await store.get_json(T, C, keys.CHECKPOINT, "big") == big
    found = stored_keys(url, store.prefix)
    sizes = {k.rsplit(":", 1)[1]: v for k, v in found.items()}
    assert sizes["big"] < 0.3 * len(str(big))
    assert sizes["small"] == len(b'{"n":1}')  # short JSON stays plain


# -- a single Redis: one round trip each, all or nothing --------------------------------


@pytest.fixture
async def counted(redis_url: str, redis_key_prefix: str) -> AsyncIterator[tuple[Store, list[int]]]:
    """A Store whose connections count the requests they send: each send is one round
    trip (a pipeline or MULTI/EXEC goes out as one send)."""
    pool = BlockingConnectionPool.from_url(redis_url, max_connections=4, timeout=1)
    sent = [0]
    base = pool.connection_class

    class Counting(base):  # type: ignore[misc, valid-type]
        async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            sent[0] += 1
            await super().send_packed_command(command, check_health)

    pool.connection_class = Counting
    store = Store(Redis.from_pool(pool), prefix=redis_key_prefix, op_timeout=5.0)
    assert await store.ping()  # the connection's handshake is not counted below
    yield store, sent
    await store.close()


async def test_each_executor_call_is_one_round_trip(counted: tuple[Store, list[int]]) -> None:
    store, sent = counted

    async def trips(call: Any) -> int:
        before = sent[0]
        await call
        return sent[0] - before

    blobs = [(f"r_{i}", tool_output(i, 12_000)) for i in range(48)]
    touch = [f"r_{i}" for i in range(60)]
    assert await trips(store.load_conversation(T, C, "s")) == 1
    assert await trips(store.load_conversation(T, C, "s", summaries=["a", "b"])) == 1
    crossing = store.save_crossing(
        T, C, root="s", checkpoint=CHECKPOINT, blobs=blobs, summary=("a", "text"), touch=touch
    )
    assert await trips(crossing) == 1
    assert (await store.load_conversation(T, C, "s")).checkpoint == CHECKPOINT
    assert await trips(store.read_blob(T, C, "r_3")) == 0  # just written by this replica
    store.blob_cache.clear()
    assert await trips(store.read_blob(T, C, "r_3")) == 1
    assert await trips(store.touch_refs(T, C, touch)) == 1


async def test_a_crossing_is_all_or_nothing_on_a_single_redis(
    embedded_redis: Callable[[], EmbeddedRedis], make_store: Callable[..., Store]
) -> None:
    server = embedded_redis()
    store = make_store(server.url, op_timeout=5.0)
    first = await store.save_crossing(
        T, C, root="s", checkpoint=CHECKPOINT, blobs=[("r_old", "x" * 500)], summary=None, touch=[]
    )
    assert first.complete
    client = redis.asyncio.Redis.from_url(server.url)
    try:
        await client.config_set("maxmemory-policy", "noeviction")
        await client.config_set("maxmemory", "1")  # every write is refused
        saved = await store.save_crossing(
            T, C, root="s", checkpoint={"new": True}, blobs=[("r_new", "y" * 500)],
            summary=("k", "paid for"), touch=["r_old"],
        )  # fmt: skip
        await client.config_set("maxmemory", "0")
        assert (saved.blobs, saved.checkpoint, saved.summary) == (False, False, False)
        assert "OutOfMemoryError" in saved.error and "yyyy" not in saved.error
        state = await store.load_conversation(T, C, "s", summaries=["k"])
        assert state.checkpoint == CHECKPOINT and state.summaries == {}
        store.blob_cache.clear()
        assert await store.read_blob(T, C, "r_new") is None
    finally:
        await client.aclose()


# -- a Cluster: a checkpoint is never left naming blobs that failed ---------------------


async def test_cluster_drops_a_checkpoint_whose_blob_failed(
    redis_cluster_url: str, make_store: Callable[..., Store]
) -> None:
    store = make_store(redis_cluster_url, op_timeout=5.0)
    client = redis.RedisCluster.from_url(redis_cluster_url.split("?")[0])
    try:

        def node_of(key: str) -> Any:
            return client.get_node_from_key(key)

        # A conversation whose checkpoint lives on another node than the blob.
        ref = "r_blob"
        blob_node = node_of(keys.blob_key(store.prefix, T, ref))
        conversation = next(
            c
            for c in (f"conv{i}" for i in range(100))
            if node_of(keys.conversation_key(store.prefix, T, c, keys.CHECKPOINT, "s")).name
            != blob_node.name
        )
        assert key_slot(keys.blob_key(store.prefix, T, ref).encode()) >= 0
        blob_conn = blob_node.redis_connection
        blob_conn.config_set("maxmemory-policy", "noeviction")
        blob_conn.config_set("maxmemory", "1")
        try:
            saved = await store.save_crossing(
                T, conversation, root="s", checkpoint=CHECKPOINT, blobs=[(ref, "z" * 800)],
                summary=("k", "paid for"), touch=[],
            )  # fmt: skip
        finally:
            blob_conn.config_set("maxmemory", "0")
        assert (saved.blobs, saved.checkpoint, saved.summary) == (False, False, True), saved
        assert "OutOfMemoryError" in saved.error
        state = await store.load_conversation(T, conversation, "s", summaries=["k"])
        assert state.checkpoint is None  # written, then taken back
        assert state.summaries == {"k": "paid for"}  # kept: it is valid without the blob
    finally:
        client.close()


async def test_memory_is_reported_for_every_server(url: str, store: Store) -> None:
    before = await store.memory()
    await store.save_crossing(
        T, C, root="s", checkpoint=None, blobs=[("r_big", os.urandom(200_000).hex())],
        summary=None, touch=[],
    )  # fmt: skip
    after = await store.memory()
    assert after.used > before.used > 0
    assert after.policy and after.evicted >= 0 and after.limit >= 0


async def test_cluster_takes_the_checkpoint_back_when_a_node_does_not_answer(
    redis_cluster_url: str, make_store: Callable[..., Store]
) -> None:
    """A node that stalls past the timeout: the checkpoint written on another node is
    deleted, since the blobs it names may not be stored."""
    store = make_store(redis_cluster_url, op_timeout=0.2)
    client = redis.RedisCluster.from_url(redis_cluster_url.split("?")[0])
    try:
        ref = "r_stalled"
        blob_node = client.get_node_from_key(keys.blob_key(store.prefix, T, ref))
        conversation = next(
            c
            for c in (f"conv{i}" for i in range(100))
            if client.get_node_from_key(
                keys.conversation_key(store.prefix, T, c, keys.CHECKPOINT, "s")
            ).name
            != blob_node.name
        )
        assert await store.ping()  # the client knows the cluster before the stall
        pid = int(blob_node.redis_connection.info("server")["process_id"])
        os.kill(pid, signal.SIGSTOP)  # well under cluster-node-timeout (2 s)
        try:
            saved = await store.save_crossing(
                T, conversation, root="s", checkpoint=CHECKPOINT, blobs=[(ref, "q" * 800)],
                summary=None, touch=[],
            )  # fmt: skip
        finally:
            os.kill(pid, signal.SIGCONT)
        assert (saved.blobs, saved.checkpoint) == (False, False)
        assert saved.error.startswith("redis: ")
        state = await make_store(redis_cluster_url, op_timeout=5.0).load_conversation(
            T, conversation, "s"
        )
        assert state.checkpoint is None
    finally:
        client.close()


def test_decoded_lines_are_kept_within_their_bounds() -> None:
    from proxy.store.crossing import MISSING, LineMemo

    made: list[bytes] = []

    def decode(raw: Any) -> object:
        made.append(raw)
        return raw

    memo = LineMemo(size=2, stored=10)
    for raw in (b"aaaa", b"bbbb", b"aaaa", b"cccc", b"aaaa", b"x" * 11, b"x" * 11):
        found = memo.get(raw, decode)
        if found is MISSING:
            found = decode(raw)
            memo.put(raw, decode, found)
        assert found == raw
    # aaaa and bbbb kept (aaaa then found); cccc would pass the 10 bytes: the memo starts
    # again with it, and aaaa is made again; a value over the bound alone is never kept.
    assert made == [b"aaaa", b"bbbb", b"cccc", b"aaaa", b"x" * 11, b"x" * 11]
