"""The real Gemini CLI, installed from the pinned package.json of an agents folder and run
headless against a base URL (the proxy, or anything speaking the Gemini API).

`run_gemini_cli(...)` starts it with a fresh HOME whose settings pick API-key auth (and
whatever else the caller sets), `GOOGLE_GEMINI_BASE_URL`, a test `GEMINI_API_KEY`, the
workspace trusted, `--yolo` (its tools run without asking) and `--output-format json`,
and returns what it printed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from proxy.testing.agent_install import AgentInstallError, clean_env, run_cli

PACKAGE = "@google/gemini-cli"
API_KEY = "gemini-cli-test-key"


def gemini_command(folder: Path) -> list[str]:
    """How to start the installed CLI."""
    binary = folder / "node_modules" / ".bin" / "gemini"
    if not binary.exists():
        raise AgentInstallError(f"{PACKAGE} is not installed under {folder}")
    return [str(binary)]


@dataclass
class GeminiCliRun:
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    home: Path

    @property
    def result(self) -> dict[str, Any]:
        """The JSON the CLI printed (`response`, `stats`), {} when there is none."""
        start = self.stdout.find("{")
        try:
            out = orjson.loads(self.stdout[start:]) if start >= 0 else {}
        except orjson.JSONDecodeError:
            return {}
        return out if isinstance(out, dict) else {}

    @property
    def final_text(self) -> str:
        return str(self.result.get("response") or "")

    def stored(self) -> str:
        """Everything the CLI wrote under its HOME (chats, logs), as one text."""
        root = self.home / ".gemini"
        parts = [p.read_text(errors="replace") for p in sorted(root.rglob("*")) if p.is_file()]
        return "\n".join(parts)


def gemini_env(base_url: str, home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return clean_env(
        home,
        extra,
        GEMINI_API_KEY=API_KEY,
        GOOGLE_GEMINI_BASE_URL=base_url,
        GEMINI_CLI_TRUST_WORKSPACE="true",
        NO_BROWSER="true",
    )


async def run_gemini_cli(
    command: Sequence[str],
    *,
    base_url: str,
    prompt: str,
    workdir: Path,
    home: Path,
    settings: Mapping[str, Any] | None = None,
    model: str | None = None,
    extra_env: Mapping[str, str] | None = None,
    time_limit: float = 600,
) -> GeminiCliRun:
    """Run `gemini -p PROMPT --yolo -o json` in `workdir` (HOME must exist), its
    settings.json API-key auth plus `settings`; killed with its children after
    `time_limit` seconds."""
    chosen = {"security": {"auth": {"selectedType": "gemini-api-key"}}, **(settings or {})}
    (home / ".gemini").mkdir(parents=True, exist_ok=True)
    (home / ".gemini" / "settings.json").write_bytes(orjson.dumps(chosen))
    argv = [*command, "-p", prompt, "--yolo", "--output-format", "json"]
    if model:
        argv += ["--model", model]
    env = gemini_env(base_url, home, extra_env)
    returncode, out, err = await run_cli(argv, cwd=workdir, env=env, time_limit=time_limit)
    return GeminiCliRun(returncode, out, err, home)
