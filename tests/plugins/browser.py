"""A real browser for the dashboard tests: Debian's Chromium driven by Playwright.

Playwright's own browser download is not used (it is not reachable everywhere the tests
run): the `chromium` Debian package is, installed here when it is missing (as root, or
through passwordless sudo), so the tests depend on nothing installed by hand.

- `chromium` (session): the path of the browser binary, installed if needed.
- `browser`: a Playwright Browser on it, headless, with a fresh empty profile (Playwright
  makes a temporary user-data-dir for every launch), closed after the test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, async_playwright

CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def install_chromium() -> Path:
    if CHROMIUM.exists():
        return CHROMIUM
    if shutil.which("apt-get") is None:
        pytest.fail(f"{CHROMIUM} is missing and there is no apt-get to install it")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*sudo, "apt-get", "install", "-y", "--no-install-recommends", "chromium"]
    done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:  # stale package lists: refresh them once and try again
        subprocess.run([*sudo, "apt-get", "update"], env=env, capture_output=True, check=False)
        done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not CHROMIUM.exists():
        pytest.fail(f"could not install chromium: {done.stderr[-2000:]}")
    return CHROMIUM


@pytest.fixture(scope="session")
def chromium() -> Path:
    return install_chromium()


@pytest.fixture
async def browser(chromium: Path) -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=str(chromium), args=list(LAUNCH_ARGS)
        )
        try:
            yield launched
        finally:
            await launched.close()
