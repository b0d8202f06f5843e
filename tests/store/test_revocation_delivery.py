"""A revocation is out of Redis when `Accounts.revoke_key` returns, even if Redis dies then.

Redis answers PUBLISH before it writes the message to the subscribers; a replica's
revocation watch is one of them. On a loaded machine the revoker, woken by that answer,
may preempt Redis between the two writes and kill it (as
tests/fleet/test_outages.py::test_a_revoked_key_stops_within_cache_seconds_during_an_outage
does): the replica never heard of the revocation and trusted the key into the outage
(200 where 503 was due). Here strace holds every write of Redis for 200 ms, the gap a
preemption opens, so the order is the same on every run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from proxy.store import EmbeddedRedis, Store
from proxy.store.accounts import Accounts
from tests.plugins.debian import ensure_package

PREFIX = "cpdelivery:"
T = TypeVar("T")


def _held_writes(pid: int) -> subprocess.Popen[bytes]:
    """strace on Redis's main thread (where it writes to clients): each write returns
    200 ms late. Returns once attached."""
    strace = ensure_package(Path("/usr/bin/strace"), "strace")
    tracer = subprocess.Popen(
        [strace, "-p", str(pid), "-e", "trace=write", "-e", "inject=write:delay_exit=200000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert tracer.stderr is not None
    line = tracer.stderr.readline()
    assert b"attached" in line, line
    return tracer


def test_a_revocation_reaches_a_subscriber_though_redis_dies_as_revoke_key_returns(
    embedded_redis: Callable[[], EmbeddedRedis],
) -> None:
    server = embedded_redis()

    async def with_accounts(work: Callable[[Accounts], Awaitable[T]]) -> T:
        store = Store.from_url(server.url, prefix=PREFIX, op_timeout=5.0)
        try:
            return await work(Accounts(store))
        finally:
            await store.close()

    _, record = asyncio.run(
        with_accounts(lambda a: a.create_key(team="delivery", upstream_env="ANTHROPIC_API_KEY"))
    )
    key_id = record["id"]

    watch = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    watch.settimeout(5.0)
    watch.connect(str(server.socket_path))
    channel = Accounts(Store.from_url(server.url, prefix=PREFIX)).revocations_channel().encode()
    watch.sendall(b"SUBSCRIBE " + channel + b"\r\n")
    assert b"subscribe" in watch.recv(1000)

    assert server.pid is not None
    tracer = _held_writes(server.pid)
    try:
        assert asyncio.run(with_accounts(lambda a: a.revoke_key(key_id)))
        os.kill(server.pid, signal.SIGKILL)  # the moment the revoker has its answer
    finally:
        tracer.wait(timeout=10)
        server.stop_sync()
    heard = b""
    while chunk := watch.recv(1000):  # what Redis wrote to the watch before it died
        heard += chunk
    watch.close()
    assert b"message" in heard and key_id.encode() in heard, heard
