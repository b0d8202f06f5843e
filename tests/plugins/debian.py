"""A Debian package a test needs, installed when it is missing (as root, or through
passwordless sudo), so the tests depend on nothing installed by hand: Chromium for the
dashboard's browser tests, strace for the test that holds Redis between its writes."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def ensure_package(binary: Path, package: str) -> Path:
    """`binary`, after installing `package` when it is not there; fails the test (never
    skips it) when it cannot be had."""
    if binary.exists():
        return binary
    if shutil.which("apt-get") is None:
        pytest.fail(f"{binary} is missing and there is no apt-get to install {package}")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*sudo, "apt-get", "install", "-y", "--no-install-recommends", package]
    done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:  # stale package lists: refresh them once and try again
        subprocess.run([*sudo, "apt-get", "update"], env=env, capture_output=True, check=False)
        done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not binary.exists():
        pytest.fail(f"could not install {package}: {done.stderr[-2000:]}")
    return binary
