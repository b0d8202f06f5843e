"""`compaction-proxy serve` as a child process, the way a user starts it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def serve_process(
    args: list[str], env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen, str]]:  # type: ignore[type-arg]
    """`python -m proxy serve ARGS`, yielded with its URL once it listens; killed after if
    still running. The test's own COMPACTION_PROXY_* variables are not passed on, `env` is."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_PROXY_")}
    child_env.update(env or {})
    child = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", *args],
        env=child_env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stderr is not None
        url = ""
        for line in child.stderr:
            if "listening on " in line:
                url = line.split("listening on ")[1].split(",")[0]
                break
        assert url.startswith("http://127.0.0.1:")
        yield child, url
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
