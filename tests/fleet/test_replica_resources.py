"""One replica's shared resources, through a real `serve` process: its event loop, its
connections and file descriptors, its logs.

- Planning a huge history happens off the event loop: other clients are served while it
  runs (observed between the Redis commands that start and end the planning step).
- Idle and trickling clients are cut off (header and body timeouts), and the number of
  connections fits the open-file limit: at a limit of 256 files, 300 slow connections
  do not make every request fail with "Too many open files".
- A malformed header line holding a key never reaches the log.
"""

from __future__ import annotations

import contextlib
import re
import resource
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import orjson
import redis

from proxy.store import EmbeddedRedis
from proxy.testing.standin import StandInOptions
from tests.fleet.test_fleet import start_replicas
from tests.plugins.redis import delete_keys
from tests.plugins.standin import RunningStandIn

KEYS_OFF = '[auth]\nkeys = "off"\n'


def _healthz(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=30) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def test_planning_a_huge_history_leaves_the_loop_to_other_clients(
    tmp_path: Path,
    embedded_redis: Callable[[], EmbeddedRedis],
    make_standin_thread: Callable[[StandInOptions], RunningStandIn],
) -> None:
    """One request of 100k tiny messages delayed every other client of the replica by
    seconds: planning ran on the event loop (finding 8). The planning step runs between
    two Redis commands of the conversation (the checkpoint read, then the summary read
    or the crossing's writes); health checks sent one after another must keep being
    answered in between."""
    server = embedded_redis()
    standin = make_standin_thread(StandInOptions(max_recorded=None))
    (replica,) = start_replicas(tmp_path, 1, standin.url, server.url, "cploop:", auth=KEYS_OFF)
    commands: list[tuple[float, str]] = []
    answered: list[float] = []
    done = threading.Event()

    def monitor() -> None:
        client = redis.Redis.from_url(server.url)
        with client.monitor() as feed:
            for event in feed.listen():
                commands.append((float(event["time"]), str(event["command"])))
                if done.is_set():
                    return

    def ping() -> None:
        while not done.is_set():
            if _healthz(replica.url):
                answered.append(time.time())

    watchers = [threading.Thread(target=monitor, daemon=True), threading.Thread(target=ping)]
    messages: list[dict[str, Any]] = []
    for n in range(20_000):
        messages += [{"role": "user", "content": f"q{n}"}, {"role": "assistant", "content": "a"}]
    messages.append({"role": "user", "content": "And now?"})
    try:
        for watcher in watchers:
            watcher.start()
        time.sleep(0.5)
        with anthropic.Anthropic(base_url=replica.url, api_key="sk-loop", max_retries=0) as c:
            reply = c.messages.with_raw_response.create(
                model="claude-haiku-4-5",
                max_tokens=32,
                messages=messages,  # type: ignore[arg-type]
                extra_headers={"x-conversation-id": f"loop-{uuid.uuid4().hex}"},
                timeout=600,
            )
        assert reply.headers["x-compaction-strategy"]  # it was planned and rewritten
        done.set()
        with contextlib.suppress(Exception):
            redis.Redis.from_url(server.url).ping()  # wakes the monitor to see `done`
        for watcher in watchers:
            watcher.join(30)
    finally:
        done.set()
        replica.stop()
    read = next(
        (t, found.group(0))
        for t, command in commands
        if (found := re.search(r"\{[^}]+\}", command)) and ":lines:" in command
    )
    start, tag = read
    # Planning runs between the load (its HGETALL) and the crossing's write.
    end = next(
        t
        for t, command in commands
        if t > start and tag in command and not command.startswith(("GET ", "HGETALL "))
    )
    during = [t for t in answered if start < t < end]
    assert len(during) >= 3, (end - start, len(answered))


def _limit_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


def test_slow_clients_are_cut_off_and_connections_fit_the_file_limit(
    tmp_path: Path,
    redis_url: str,
    make_standin_thread: Callable[[StandInOptions], RunningStandIn],
) -> None:
    """300 idle or trickling connections stayed open past 90 s, and at a file limit of
    256 every request then got 502 "Too many open files" (finding 9)."""
    standin = make_standin_thread(StandInOptions(max_recorded=None))
    extra = "[server]\nheader_timeout = 1.0\nbody_timeout = 1.0\n"
    prefix = f"cpslow:{uuid.uuid4().hex[:8]}:"
    (replica,) = start_replicas(
        tmp_path,
        1,
        standin.url,
        redis_url,
        prefix,
        extra,
        auth=KEYS_OFF,
        preexec_fn=_limit_files,
    )
    host, port = replica.url.removeprefix("http://").rsplit(":", 1)
    body_head = (
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: sk-slow\r\n"
        b"anthropic-version: 2023-06-01\r\nContent-Length: 1000\r\n\r\n{"
    )
    slow: list[socket.socket] = []
    try:
        for n in range(300):
            sock = socket.create_connection((host, int(port)), timeout=30)
            if n % 3 == 1:
                sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: ")  # headers never end
            elif n % 3 == 2:
                sock.sendall(body_head)  # a body that never comes
            slow.append(sock)
        # Every slow connection is closed by the proxy (within 30 s; the timeouts are 1 s),
        # those with a body after a 408.
        deadline = time.monotonic() + 30
        closed: list[bytes] = []
        for sock in slow:
            received = b""
            while True:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    break  # still open
                except ConnectionError:  # reset: refused over the cap
                    chunk = b""
                if not chunk:
                    closed.append(received)
                    break
                received += chunk
        assert len(closed) == 300
        timed_out = [r for r in closed if r.startswith(b"HTTP/1.1 408")]
        assert timed_out and all(b"did not arrive in time" in r for r in timed_out)
        # A client that sends its request is served, not given "Too many open files".
        with anthropic.Anthropic(base_url=replica.url, api_key="sk-slow", max_retries=3) as c:
            answer = c.messages.create(
                model="claude-haiku-4-5",
                max_tokens=16,
                messages=[{"role": "user", "content": "hi"}],
            )
        assert answer.content
    finally:
        for sock in slow:
            sock.close()
        replica.stop()
        delete_keys(redis_url, prefix)
    log = replica.log.read_text()
    assert "Too many open files" not in log
    assert re.search(r"at most \d+ client connections", log)  # the cap fitted the limit


def test_a_malformed_header_line_never_reaches_the_log(
    tmp_path: Path,
    redis_url: str,
    make_standin_thread: Callable[[StandInOptions], RunningStandIn],
) -> None:
    """aiohttp logged a malformed header line, API key included (a Low item)."""
    standin = make_standin_thread(StandInOptions(max_recorded=None))
    prefix = f"cplog:{uuid.uuid4().hex[:8]}:"
    (replica,) = start_replicas(tmp_path, 1, standin.url, redis_url, prefix, auth=KEYS_OFF)
    canary = f"sk-canary-{uuid.uuid4().hex}"
    host, port = replica.url.removeprefix("http://").rsplit(":", 1)
    try:
        for raw in (
            f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {canary}\x01\r\n\r\n",
            f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nbad header {canary}\r\n\r\n",
            f"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: {canary}\r\n\r\n",
        ):
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                sock.sendall(raw.encode())
                assert sock.recv(65536).startswith(b"HTTP/1.")
        assert _healthz(replica.url)
    finally:
        replica.stop()
        delete_keys(redis_url, prefix)
    log = replica.log.read_text()
    assert "malformed request (BadHttpMessage, 400)" in log
    assert canary not in log
    assert orjson.dumps(canary)[1:-1].decode() not in log
