"""The real agent CLIs the end-to-end tests drive, installed from the pinned lock file
(tests/agents/package.json): `npm ci` when node_modules is missing or older than the lock;
and run with a time limit (`run_cli`)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

NPM_CI_TIMEOUT = 900


class AgentInstallError(RuntimeError):
    """npm or node is missing, or `npm ci` failed; the message says which."""


def install(folder: Path) -> None:
    """`npm ci` in `folder` unless its node_modules is already as the lock says."""
    marker = folder / "node_modules" / ".package-lock.json"  # npm writes it on install
    lock = folder / "package-lock.json"
    if marker.exists() and marker.stat().st_mtime >= lock.stat().st_mtime:
        return
    npm = shutil.which("npm")
    if npm is None:
        raise AgentInstallError("npm is not installed (the agent tests need node and npm)")
    done = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=NPM_CI_TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        raise AgentInstallError(f"npm ci failed in {folder}:\n{done.stdout}\n{done.stderr}")


def clean_env(home: Path, extra: Mapping[str, str] | None, **fixed: str) -> dict[str, str]:
    """A clean environment: nothing of the caller's (keys, settings) but PATH and locale;
    then `fixed`, then `extra`."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")}
    env.update(HOME=str(home), **fixed)
    env.update(extra or {})
    return env


def json_lines(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """A CLI's JSON-lines output: the objects, and the lines that were not JSON."""
    events: list[dict[str, Any]] = []
    unparsed: list[str] = []
    for line in text.splitlines():
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            unparsed.append(line)
            continue
        if isinstance(event, dict):
            events.append(event)
    return events, unparsed


async def run_cli(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], time_limit: float
) -> tuple[int | None, str, str]:
    """Run an agent CLI to its end: (exit status, None when it was killed at the time
    limit; its stdout; its stderr). It gets its own process group, so the kill ends its
    children too (and so does the caller's cancellation)."""
    child = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    returncode: int | None
    try:
        out, err = await asyncio.wait_for(child.communicate(), time_limit)
        returncode = child.returncode
    except TimeoutError:
        os.killpg(child.pid, signal.SIGKILL)
        out, err = await child.communicate()
        returncode = None
    except asyncio.CancelledError:
        os.killpg(child.pid, signal.SIGKILL)
        raise
    return returncode, out.decode(errors="replace"), err.decode(errors="replace")
