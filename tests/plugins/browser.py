"""A real browser for the dashboard tests: Debian's Chromium driven by Playwright.

Playwright's own browser download is not used (it is not reachable everywhere the tests
run): the `chromium` Debian package is, installed here when it is missing (as root, or
through passwordless sudo), so the tests depend on nothing installed by hand.

- `chromium` (session): the path of the browser binary, installed if needed.
- `browser`: a Playwright Browser on it, headless, with a fresh empty profile (Playwright
  makes a temporary user-data-dir for every launch), closed after the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, async_playwright

from tests.plugins.debian import ensure_package

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
    return ensure_package(CHROMIUM, "chromium")


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
