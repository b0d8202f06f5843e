"""The real agent CLIs the end-to-end tests drive, installed from the pinned lock file
(tests/agents/package.json): `npm ci` when node_modules is missing or older than the lock."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

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
