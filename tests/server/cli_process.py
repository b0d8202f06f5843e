"""The `compaction-proxy` command run as a child process, as a person runs it: its own
HOME and state directory, none of the test's COMPACTION_PROXY_* or REDIS_URL variables."""

from __future__ import annotations

import importlib.metadata
import os
import re
import signal
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# `python -c HIDE_EXTRAS MODULES ARGS...`: the CLI with the listed modules (the optional
# extras' packages: top-level ones, or a namespace package's parts such as
# opentelemetry.sdk) made unimportable, as after `pip install .` with no extras.
HIDE = """
import importlib.abc, runpy, sys
hidden = set(sys.argv.pop(1).split(","))
def _hidden(name):
    parts = name.split(".")
    return any(".".join(parts[:n]) in hidden for n in range(1, len(parts) + 1))
class Hidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if _hidden(name):
            raise ModuleNotFoundError(f"No module named {name!r} (an extra's: hidden)", name=name)
sys.meta_path.insert(0, Hidden())
"""
HIDE_EXTRAS = HIDE + 'runpy.run_module("proxy", run_name="__main__", alter_sys=True)\n'


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement)[0].lower().replace("_", "-").replace(".", "-")


def _installed_with(names: set[str]) -> set[str]:
    """`names` and every distribution they require, as installed (extras' own left out)."""
    found, todo = set(), list(names)
    while todo:
        dist = todo.pop()
        if dist in found:
            continue
        found.add(dist)
        try:
            requires = importlib.metadata.requires(dist) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        todo.extend(_name(r) for r in requires if "extra ==" not in r.partition(";")[2])
    return found


def _parts(dist: str, top: str) -> set[str]:
    """The packages directly under namespace package `top` that `dist` installs."""
    files = importlib.metadata.distribution(dist).files or []
    return {
        f"{top}.{f.parts[1]}"
        for f in files
        if len(f.parts) > 2 and f.parts[0] == top and not f.parts[1].endswith(".dist-info")
    }


def extras_modules() -> list[str]:
    """Modules of the packages only the optional extras install: top-level ones, and
    the parts of a namespace package (opentelemetry) the base install has only some of
    (the test extra's opentelemetry-proto beside the base install's SDK)."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text())["project"]
    direct = {_name(r) for r in project["dependencies"]}
    base = _installed_with(direct)
    extras = {_name(r) for rs in project["optional-dependencies"].values() for r in rs}
    extras = _installed_with(extras - direct - {_name(project["name"])}) - base
    modules = set()
    for module, dists in importlib.metadata.packages_distributions().items():
        owners = {_name(d) for d in dists}
        if not owners & extras:
            continue
        if not owners & base:
            modules.add(module)
            continue
        shared = set().union(*(_parts(d, module) for d in owners & base))
        for dist in owners & extras:
            modules |= _parts(dist, module) - shared
    return sorted(modules)


def command(args: list[str], hide_extras: bool = False) -> list[str]:
    if hide_extras:
        return [sys.executable, "-c", HIDE_EXTRAS, ",".join(extras_modules()), *args]
    return [sys.executable, "-m", "proxy", *args]


def cli_env(home: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("COMPACTION_PROXY_") and k not in ("REDIS_URL", "XDG_STATE_HOME")
    }
    env.update(HOME=str(home), XDG_STATE_HOME=str(home / "state"), **extra)
    return env


def run_cli(
    args: list[str],
    env: dict[str, str],
    cwd: Path | None = None,
    timeout: float = 100,
    hide_extras: bool = False,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(args, hide_extras),
        env=env,
        cwd=cwd or env["HOME"],  # not the checkout: its config/proxy.toml would be read
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextmanager
def cli_process(
    args: list[str], env: dict[str, str], cwd: Path | None = None, hide_extras: bool = False
) -> Iterator[subprocess.Popen[str]]:
    """The command running, its stderr a pipe; SIGTERM then kill when the block ends."""
    child = subprocess.Popen(
        command(args, hide_extras),
        env=env,
        cwd=cwd or env["HOME"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield child
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
        child.wait()
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()


def read_until(stream: object, needle: str) -> list[str]:
    """Lines of a child's output up to and including the first holding `needle` (the
    test's timeout bounds the wait); all of them if the stream ends first."""
    lines = []
    for line in stream:  # type: ignore[attr-defined]
        lines.append(line)
        if needle in line:
            break
    return lines


@contextmanager
def occupied_port() -> Iterator[int]:
    """A loopback port something else is listening on."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]
