"""`compaction-proxy serve` as a user runs it: a process that serves until SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request

import orjson

from tests.plugins.standin import RunningStandIn


def test_serve_runs_until_sigterm(standin_thread: RunningStandIn, redis_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
    command = [
        sys.executable,
        "-m",
        "proxy",
        "serve",
        "--port",
        "0",
        "--upstream",
        standin_thread.url,
        "--redis-url",
        redis_url,
    ]
    child = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stderr is not None
        url = ""
        for line in child.stderr:
            if "listening on " in line:
                url = line.split("listening on ")[1].split(",")[0]
                break
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(f"{url}/readyz", timeout=10) as ready:
            assert orjson.loads(ready.read())["ready"] is True
        request = urllib.request.Request(
            f"{url}/v1/models", headers={"x-api-key": "k", "anthropic-version": "2023-06-01"}
        )
        with urllib.request.urlopen(request, timeout=10) as models:
            assert orjson.loads(models.read())["data"]
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_stand_in_command_rejects_a_bad_window() -> None:
    from proxy.cli import main

    assert main(["stand-in", "--window", "0"]) == 2
