"""`compaction-proxy serve` as a user runs it: a process that serves until SIGTERM."""

from __future__ import annotations

import signal
import urllib.request

import orjson

from tests.plugins.standin import RunningStandIn
from tests.server.serve_process import serve_process


def test_serve_runs_until_sigterm(standin_thread: RunningStandIn, redis_url: str) -> None:
    args = ["--port", "0", "--upstream", standin_thread.url, "--redis-url", redis_url]
    with serve_process(args) as (child, url):
        with urllib.request.urlopen(f"{url}/readyz", timeout=10) as ready:
            assert orjson.loads(ready.read())["ready"] is True
        request = urllib.request.Request(
            f"{url}/v1/models", headers={"x-api-key": "k", "anthropic-version": "2023-06-01"}
        )
        with urllib.request.urlopen(request, timeout=10) as models:
            assert orjson.loads(models.read())["data"]
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == 0


def test_stand_in_command_rejects_a_bad_window() -> None:
    from proxy.cli import main

    assert main(["stand-in", "--window", "0"]) == 2
