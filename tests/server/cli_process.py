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

# `python -c HIDE_EXTRAS MODULES ARGS...`: the CLI with the listed top-level modules (the
# optional extras' packages) made unimportable, as after `pip install .` with no extras.
HIDE = """
import importlib.abc, runpy, sys
hidden = set(sys.argv.pop(1).split(","))
class Hidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in hidden:
            raise ModuleNotFoundError(f"No module named {name!r} (an extra's: hidden)", name=name)
sys.meta_path.insert(0, Hidden())
"""
HIDE_EXTRAS = HIDE + 'runpy.run_module("proxy", run_name="__main__", alter_sys=True)\n'


def extras_modules() -> list[str]:
    """Top-level modules of the packages only the optional extras install."""
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text())["project"]

    def name(requirement: str) -> str:
        return re.split(r"[<>=!~;\[ ]", requirement)[0].lower().replace("_", "-")

    base = {name(r) for r in project["dependencies"]}
    extras = {name(r) for rs in project["optional-dependencies"].values() for r in rs}
    extras -= base | {name(project["name"])}
    modules = set()
    for module, dists in importlib.metadata.packages_distributions().items():
        owners = {name(d) for d in dists}
        if owners & extras and not owners & base:
            modules.add(module)
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
