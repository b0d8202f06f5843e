"""Redis down, stalled or gone: every call raises StoreUnavailable, then recovers."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable

import pytest

from proxy.store import EmbeddedRedis, Store, StoreUnavailable

T, C = "tenant0", "conv0"


def every_data_call(store: Store) -> list[Callable[[], object]]:
    return [
        lambda: store.put_json(T, C, "checkpoint", "c", {"a": 1}),
        lambda: store.get_json(T, C, "checkpoint", "c"),
        lambda: store.acquire_lock(T, C, "l", 1000),
        lambda: store.release_lock(T, C, "l", "token"),
        lambda: store.update_global_mean("calibration", "m", 1.0),
        lambda: store.get_global_mean("calibration", "m"),
        lambda: store.refresh_ttl(T, C, "summary", ["s"]),
        lambda: store.load_conversation(T, C, "root"),
        lambda: store.load_conversation(T, C, "root", summaries=["s1", "s2"]),
        lambda: store.read_blob(T, C, "r_never_cached"),
        lambda: store.touch_refs(T, C, ["r", "r2"]),
    ]


async def assert_all_unavailable(store: Store) -> None:
    for call in every_data_call(store):
        with pytest.raises(StoreUnavailable):
            await call()  # type: ignore[misc]
    assert await store.ping() is False
    # A crossing's write never raises: it says that nothing is stored, and why.
    saved = await store.save_crossing(
        T, C, root="s", checkpoint={"n": 1}, blobs=[("r", "x" * 500)], summary=("k", "text"),
        touch=["r0"],
    )  # fmt: skip
    assert (saved.blobs, saved.checkpoint, saved.summary, saved.complete) == (False,) * 4
    assert saved.error.startswith("redis: ")


@pytest.fixture
async def silent_server() -> AsyncIterator[int]:
    """A TCP port that accepts connections and never answers: a stalled Redis."""
    held: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    for writer in held:
        writer.close()
    server.close()
    await server.wait_closed()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_nothing_listening(make_store) -> None:
    await assert_all_unavailable(make_store(f"redis://127.0.0.1:{closed_port()}/0"))


async def test_missing_unix_socket(make_store, tmp_path) -> None:
    await assert_all_unavailable(make_store(f"unix://{tmp_path}/none.sock"))


async def test_server_that_never_answers_times_out(make_store, silent_server: int) -> None:
    store = make_store(f"redis://127.0.0.1:{silent_server}/0", op_timeout=0.1)
    await assert_all_unavailable(store)


async def test_stopped_then_restarted_server(make_store, embedded_redis) -> None:
    server: EmbeddedRedis = embedded_redis()
    store = make_store(server.url, op_timeout=0.3)
    saved = await store.save_crossing(
        T, C, root="s", checkpoint=None, blobs=[("kept", "survives a restart")], summary=None,
        touch=[],
    )  # fmt: skip
    assert saved.complete
    token = await store.acquire_lock(T, C, "l", 60_000)
    assert token is not None

    await server.stop()
    await assert_all_unavailable(store)

    # Same socket path, same Store object: it recovers without being rebuilt.
    await server.start()
    assert await store.ping() is True
    store.blob_cache.clear()  # read from the restarted server
    assert await store.read_blob(T, C, "kept") == "survives a restart"
    assert await store.touch_refs(T, C, ["kept"]) == ()
    assert await store.release_lock(T, C, "l", token) is True
    await store.put_json(T, C, "checkpoint", "c", {"after": "restart"})
    assert await store.get_json(T, C, "checkpoint", "c") == {"after": "restart"}


async def test_stalled_server_times_out_and_answers_stay_in_order(
    make_store, embedded_redis
) -> None:
    server: EmbeddedRedis = embedded_redis()
    # No blob cache: every read below goes to Redis.
    store = make_store(server.url, op_timeout=0.2, blob_cache_chars=0)
    saved = await store.save_crossing(
        T, C, root="s", checkpoint=None, blobs=[("a", "value-a"), ("b", "value-b")],
        summary=None, touch=[],
    )  # fmt: skip
    assert saved.complete
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        with pytest.raises(StoreUnavailable):
            await store.read_blob(T, C, "a")
        assert await store.ping() is False
    finally:
        os.kill(server.pid, signal.SIGCONT)
    # The reply to the timed-out GET must never be taken as the answer to a later call.
    for _ in range(20):
        assert await store.read_blob(T, C, "b") == "value-b"
        assert await store.read_blob(T, C, "a") == "value-a"


async def test_close_is_safe_when_redis_is_down(make_store) -> None:
    store = make_store(f"redis://127.0.0.1:{closed_port()}/0")
    assert await store.ping() is False
    await store.close()
    await store.close()
