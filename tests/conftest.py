from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# No per-example deadline: the suite runs on shared 2-core machines beside other work,
# where a slow example is the machine's load, not the code's (tests/core/test_sse.py failed
# so under load). How fast the code is, is the benchmarks' to say (bench/).
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

pytest_plugins = [
    "tests.plugins.redis",
    "tests.plugins.standin",
    "tests.plugins.responses",
    "tests.plugins.browser",
    "tests.plugins.clouds",
]

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """A test that runs the CLI in-process (`cli.main(["serve", ...])`) replaces the root
    logger's handlers with one on that test's captured stderr; put them back afterwards,
    so a proxy thread still finishing a request does not log to a closed capture file."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
