"""Graceful shutdown of a real `compaction-proxy serve` process: on SIGTERM readiness fails
at once, a slow stream in flight runs to its end (within server.drain_timeout), then the
process exits 0; a stream longer than the drain time is closed when it runs out."""

from __future__ import annotations

import http.client
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import orjson

from tests.plugins.standin import RunningStandIn
from tests.server.serve_process import serve_process

WORDS = 30


@contextmanager
def serve(
    upstream: str, redis_url: str, drain: float, log_format: str = "human"
) -> Iterator[tuple[subprocess.Popen, str]]:  # type: ignore[type-arg]
    env = {
        "COMPACTION_PROXY_SERVER_PORT": "0",
        "COMPACTION_PROXY_UPSTREAM_URL": upstream,
        "COMPACTION_PROXY_SERVER_DRAIN_TIMEOUT": str(drain),
        "COMPACTION_PROXY_SERVER_LOG_FORMAT": log_format,
        "REDIS_URL": redis_url,
    }
    with serve_process([], env) as (child, url):
        yield child, url


def readiness(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=10) as r:
            return r.status, orjson.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, orjson.loads(e.read())


def open_slow_stream(url: str, delay: float) -> tuple[http.client.HTTPResponse, bytes]:
    """Start a streamed answer of WORDS deltas, `delay` seconds apart; return the
    response and its first bytes."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    script = {"text": " ".join(f"w{i}" for i in range(WORDS)), "chunk_tokens": 1}
    script["token_delay"] = delay
    body = {
        "model": "claude-test-1",
        "max_tokens": 200,
        "stream": True,
        "messages": [{"role": "user", "content": "Say the words slowly."}],
    }
    connection.request(
        "POST",
        "/v1/messages",
        body=orjson.dumps(body),
        headers={
            "x-api-key": "sk-drain",
            "anthropic-version": "2023-06-01",
            "content-type": "application/json",
            "x-stand-in": orjson.dumps(script).decode(),
        },
    )
    response = connection.getresponse()
    assert response.status == 200
    return response, response.read1(65536)


def rest_of(response: http.client.HTTPResponse) -> tuple[bytes, bool]:
    """The remaining stream, and whether it ended cleanly."""
    chunks = []
    try:
        while chunk := response.read1(65536):
            chunks.append(chunk)
    except (http.client.IncompleteRead, ConnectionError):
        return b"".join(chunks), False
    return b"".join(chunks), True


def until_not_ready(url: str) -> tuple[int, dict[str, object]]:
    for _ in range(200):
        status, body = readiness(url)
        if status == 503:
            return status, body
        time.sleep(0.05)
    raise AssertionError("readiness never failed after SIGTERM")


def test_sigterm_fails_readiness_and_lets_the_stream_finish(
    standin_thread: RunningStandIn, redis_url: str
) -> None:
    with serve(standin_thread.url, redis_url, drain=60, log_format="json") as (child, url):
        assert readiness(url)[0] == 200
        response, first = open_slow_stream(url, delay=0.1)
        assert b"message_start" in first
        child.send_signal(signal.SIGTERM)
        _, body = until_not_ready(url)
        assert body["draining"] is True and body["ready"] is False
        rest, clean = rest_of(response)
        assert clean and b"event: message_stop" in rest
        text = (first + rest).decode()
        assert all(f"w{i}" in text for i in range(WORDS)), "every delta arrived"
        assert child.wait(timeout=60) == 0
        assert child.stderr is not None
        lines = [orjson.loads(line) for line in child.stderr.read().splitlines() if line]
        stream = [x for x in lines if x.get("route") == "/v1/messages"]
        assert len(stream) == 1 and stream[0]["status"] == 200
        assert stream[0]["output_tokens"] > 0 and stream[0]["duration_ms"] > 0
        assert any("draining" in x["message"] for x in lines)


def test_a_stream_longer_than_the_drain_is_closed(
    standin_thread: RunningStandIn, redis_url: str
) -> None:
    with serve(standin_thread.url, redis_url, drain=0.3) as (child, url):
        response, first = open_slow_stream(url, delay=1.0)
        assert b"message_start" in first
        child.send_signal(signal.SIGTERM)
        rest, clean = rest_of(response)
        assert not clean and b"message_stop" not in rest
        assert child.wait(timeout=60) == 0
