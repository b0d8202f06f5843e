"""The `compaction-proxy` command run as a child process, as a person runs it: its own
HOME and state directory, none of the test's COMPACTION_PROXY_* or REDIS_URL variables."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def cli_env(home: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("COMPACTION_PROXY_") and k not in ("REDIS_URL", "XDG_STATE_HOME")
    }
    env.update(HOME=str(home), XDG_STATE_HOME=str(home / "state"), **extra)
    return env


def run_cli(
    args: list[str], env: dict[str, str], cwd: Path | None = None, timeout: float = 100
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        env=env,
        cwd=cwd or env["HOME"],  # not the checkout: its config/proxy.toml would be read
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextmanager
def cli_process(
    args: list[str], env: dict[str, str], cwd: Path | None = None
) -> Iterator[subprocess.Popen[str]]:
    """The command running, its stderr a pipe; SIGTERM then kill when the block ends."""
    child = subprocess.Popen(
        [sys.executable, "-m", "proxy", *args],
        env=env,
        cwd=cwd or env["HOME"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield child
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
        child.wait()
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()


def read_until(stream: object, needle: str) -> list[str]:
    """Lines of a child's output up to and including the first holding `needle` (the
    test's timeout bounds the wait); all of them if the stream ends first."""
    lines = []
    for line in stream:  # type: ignore[attr-defined]
        lines.append(line)
        if needle in line:
            break
    return lines


@contextmanager
def occupied_port() -> Iterator[int]:
    """A loopback port something else is listening on."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]
