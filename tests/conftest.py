from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = [
    "tests.plugins.redis",
    "tests.plugins.standin",
    "tests.plugins.responses",
    "tests.plugins.browser",
]

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
