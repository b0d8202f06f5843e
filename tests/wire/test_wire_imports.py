"""No wire format imports another: each imports the core, its own modules (anthropic,
anthropic_rounds; chat, chat_rounds; responses, responses_*; gemini, gemini_*) and
proxy/wire/common.py, where what they share lives. Only the package's __init__ names them
all."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.core.test_purity import KNOWN, ROOT, _modules, _name

WIRE = sorted(p for p in (ROOT / "wire").glob("*.py") if p.name != "__init__.py")
FORMATS = ("anthropic", "chat", "responses", "gemini")
SHARED = "proxy.wire.common"


def _format_of(module: str) -> str | None:
    """The format a proxy.wire module belongs to (None: the shared module)."""
    leaf = module.rsplit(".", 1)[-1]
    return next((f for f in FORMATS if leaf == f or leaf.startswith(f + "_")), None)


def _wire_imports(path: Path) -> set[str]:
    return {m for m in _modules(path) if m in KNOWN and m.startswith("proxy.wire")}


@pytest.mark.parametrize("path", WIRE, ids=[p.name for p in WIRE])
def test_a_format_imports_only_itself_the_core_and_the_shared_module(path: Path) -> None:
    module = _name(path)
    own = _format_of(module)
    for imported in sorted(_wire_imports(path)):
        if imported in (SHARED, "proxy.wire"):
            assert imported == SHARED, f"{module} imports the package {imported}"
            continue
        assert own is not None, f"the shared module imports a format: {imported}"
        assert _format_of(imported) == own, f"{module} imports {imported}"


def test_every_wire_module_belongs_to_a_format_or_is_shared() -> None:
    names = {_name(p) for p in WIRE}
    assert SHARED in names
    assert all(_format_of(n) is not None for n in names - {SHARED})


def test_the_check_finds_a_format_importing_another() -> None:
    assert _format_of("proxy.wire.chat_rounds") == "chat"
    assert _format_of("proxy.wire.responses_units") == "responses"
    assert _format_of("proxy.wire.anthropic") != _format_of("proxy.wire.chat")
