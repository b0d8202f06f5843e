"""`pip install .` with no extras is enough for every command of the CLI.

Two checks: every third-party module proxy/ imports (at the top of a file or inside a
function) belongs to a distribution in [project] dependencies; and each command runs for
real with the extras' packages (pytest, hypothesis, mypy, ...) made unimportable. The CI
smoke step (.ci/readme_smoke.py) does the same in a fresh venv installed by the README's
own command."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import signal
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import orjson

from tests.server.cli_process import HIDE, cli_env, cli_process, extras_modules, read_until, run_cli

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement)[0].lower().replace("_", "-")


def _guarded(tree: ast.AST) -> set[ast.AST]:
    """Import nodes inside a `try` that handles ImportError: optional by design (the
    code goes on without the module), so not required of `pip install .`."""
    guarded: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
            for h in node.handlers
        ):
            for statement in node.body:
                guarded.update(ast.walk(statement))
    return guarded


def third_party_imports() -> dict[str, set[str]]:
    """Top-level module -> the files of proxy/ that import it (absolute imports only, not
    the optional ones)."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / "proxy").rglob("*.py"):
        tree = ast.parse(path.read_text())
        optional = _guarded(tree)
        for node in ast.walk(tree):
            if node in optional:
                continue
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.partition(".")[0]
                if top != "proxy" and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_import_is_a_base_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_name(r) for r in project["dependencies"]}
    owners = importlib.metadata.packages_distributions()
    imports = third_party_imports()
    assert {"aiohttp", "anthropic", "openai", "redis"} <= set(imports)  # the walk works
    missing = {
        module: sorted(files)
        for module, files in imports.items()
        if not {_name(d) for d in owners.get(module, [])} & base
    }
    assert not missing, f"imported but not in [project] dependencies: {missing}"


def test_every_command_runs_without_the_extras(tmp_path: Path, fixtures_dir: Path) -> None:
    env = cli_env(tmp_path)
    request = fixtures_dir / "agent-requests" / "claude-code-turn7.json"
    trace = tmp_path / "trace.jsonl"
    recorded = orjson.loads(request.read_bytes())
    trace.write_bytes(orjson.dumps(recorded) + b"\n" + orjson.dumps(recorded) + b"\n")

    def ok(*args: str) -> str:
        done = run_cli(list(args), env, hide_extras=True)
        assert done.returncode == 0, f"{args}: {done.stderr}"
        return done.stdout

    assert "history" in ok("plan", str(request))
    assert "tokens" in ok("audit", str(request))
    assert "report: " in ok("replay", str(trace), "--out", str(tmp_path / "r.html"))
    assert ok("keys", "list") == "no keys\n"
    assert "team t" in ok("budgets", "show", "--team", "t")

    with cli_process(["stand-in", "--port", "0"], env, hide_extras=True) as standin:
        assert standin.stdout is not None
        standin_url = standin.stdout.readline().split("listening on ")[1].strip()
        args = ["serve", "--port", "0", "--upstream", standin_url]
        with cli_process(args, env, hide_extras=True) as serve:
            line = read_until(serve.stderr, "listening on ")[-1]
            url = line.split("listening on ")[1].split(",")[0]
            with urllib.request.urlopen(f"{url}/readyz", timeout=10) as ready:
                assert orjson.loads(ready.read())["ready"] is True
            serve.send_signal(signal.SIGTERM)
            assert serve.wait(timeout=30) == 0


def test_every_module_imports_without_the_extras() -> None:
    """All of proxy/, the modules no command test reaches included."""
    code = HIDE + (
        "import importlib, pkgutil, proxy\n"
        "names = [m.name for m in pkgutil.walk_packages(proxy.__path__, 'proxy.')]\n"
        "names = [n for n in names if n != 'proxy.__main__']  # that one runs the CLI\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "print('imported', len(names))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, ",".join(extras_modules())],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) > 80
