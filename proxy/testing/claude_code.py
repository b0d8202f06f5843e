"""The real Claude Code CLI, installed from the pinned package.json of an agents folder and
run in print mode against a base URL (the proxy, or anything speaking the Messages API).

`install(folder)` runs `npm ci` there when node_modules is missing or older than the lock;
`run_claude_code(...)` starts the CLI with a fresh HOME, no inherited credentials or
settings, and `--output-format stream-json --verbose`, and returns what it printed.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.testing.agent_install import AgentInstallError, clean_env, json_lines, run_cli

PACKAGE = "@anthropic-ai/claude-code"


def claude_command(folder: Path) -> list[str]:
    """How to start the installed CLI: its bin, or the package's node wrapper when npm
    left the bin a placeholder (install scripts not run)."""
    package = folder / "node_modules" / PACKAGE
    binary = folder / "node_modules" / ".bin" / "claude"
    if binary.exists():
        try:
            probe = subprocess.run(
                [str(binary), "--version"], capture_output=True, text=True, timeout=60
            )
        except OSError:  # the placeholder npm leaves when install scripts did not run
            probe = None
        if probe is not None and probe.returncode == 0 and "Claude Code" in probe.stdout:
            return [str(binary)]
    wrapper = package / "cli-wrapper.cjs"
    if wrapper.exists():
        return ["node", str(wrapper)]
    raise AgentInstallError(f"{PACKAGE} is not installed under {folder}")


@dataclass
class ClaudeCodeRun:
    returncode: int | None  # None: killed at the timeout
    events: list[dict[str, Any]]  # the stream-json lines
    stdout: str
    stderr: str
    home: Path
    workdir: Path
    argv: list[str] = field(default_factory=list)

    @property
    def result(self) -> dict[str, Any] | None:
        """The closing `{"type": "result", ...}` event."""
        return next((e for e in reversed(self.events) if e.get("type") == "result"), None)

    @property
    def final_text(self) -> str:
        result = self.result
        return str(result.get("result") or "") if result else ""

    def transcripts(self) -> str:
        """Everything Claude Code wrote under its HOME (session transcripts, saved tool
        output), as one text."""
        root = self.home / ".claude"
        if not root.exists():
            return ""
        parts = []
        for path in sorted(root.rglob("*")):
            if path.is_file():
                parts.append(path.read_text(errors="replace"))
        return "\n".join(parts)


def claude_env(base_url: str, home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    # As root the CLI refuses to skip permission prompts unless told it is in a sandbox.
    root = {"IS_SANDBOX": "1"} if hasattr(os, "geteuid") and os.geteuid() == 0 else {}
    return clean_env(
        home,
        extra,
        ANTHROPIC_BASE_URL=base_url,
        ANTHROPIC_API_KEY="sk-ant-test-harness",
        DISABLE_TELEMETRY="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        **root,
    )


async def run_claude_code(
    command: Sequence[str],
    *,
    base_url: str,
    prompt: str,
    workdir: Path,
    home: Path,
    model: str | None = None,
    allowed_tools: str = "Bash",
    max_turns: int | None = None,
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    time_limit: float = 600,
) -> ClaudeCodeRun:
    """Run `claude -p PROMPT` in `workdir` (HOME must exist); killed with its children
    after `time_limit` seconds."""
    argv = [*command, "-p", prompt, "--output-format", "stream-json", "--verbose"]
    argv += ["--allowedTools", allowed_tools]
    if model:
        argv += ["--model", model]
    if max_turns is not None:
        argv += ["--max-turns", str(max_turns)]
    argv += list(extra_args)
    env = claude_env(base_url, home, extra_env)
    returncode, stdout, stderr = await run_cli(argv, cwd=workdir, env=env, time_limit=time_limit)
    events, _ = json_lines(stdout)
    return ClaudeCodeRun(returncode, events, stdout, stderr, home, workdir, argv)
