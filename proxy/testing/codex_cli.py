"""Drive the real Codex CLI (`codex exec --json`) against a Responses endpoint.

Each run gets a fresh CODEX_HOME whose config.toml points Codex at `base_url` (which ends
in `/v1`), either as the built-in OpenAI provider (`openai_base_url`: Codex tries a
WebSocket first, then streams HTTP, and compacts with a `compaction_trigger` item) or as a
custom provider (`[model_providers.<name>]` with `wire_api = "responses"`: HTTP only, and
Codex compacts with a handoff-summary request of its own). The API key goes in the
environment (CODEX_API_KEY, or the custom provider's `env_key`), never in the file.

`model_context_window` and `model_auto_compact_token_limit` tell Codex the window it
sizes its own compaction by (from the usage in `response.completed`). Codex runs with
`--dangerously-bypass-approvals-and-sandbox` (the tests run as root, where its sandbox
cannot start) in `work_dir`, and is killed after `time_limit` seconds.

The Codex binary is the one tests/agents/package.json pins (`npm ci` there), or
`$CODEX_BIN`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from proxy.testing.agent_install import json_lines, run_cli

AGENTS_DIR = Path(__file__).resolve().parents[2] / "tests" / "agents"
CUSTOM_PROVIDER = "standin"
CUSTOM_KEY_ENV = "STANDIN_API_KEY"
# What Codex must not inherit from the environment of the tests.
SCRUBBED = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "CODEX_API_KEY", "CODEX_HOME", CUSTOM_KEY_ENV)


def codex_binary() -> Path:
    override = os.environ.get("CODEX_BIN")
    return Path(override) if override else AGENTS_DIR / "node_modules" / ".bin" / "codex"


@dataclass(frozen=True)
class CodexConfig:
    base_url: str  # e.g. http://127.0.0.1:8080/v1
    provider: str = "openai"  # "openai" (built-in, openai_base_url) or "custom"
    model: str = "gpt-5.5"
    context_window: int | None = None
    auto_compact_limit: int | None = None
    request_max_retries: int | None = None
    stream_max_retries: int | None = None

    def toml(self) -> str:
        lines = [f"model = {_quote(self.model)}", "check_for_update_on_startup = false"]
        if self.context_window is not None:
            lines.append(f"model_context_window = {self.context_window}")
        if self.auto_compact_limit is not None:
            lines.append(f"model_auto_compact_token_limit = {self.auto_compact_limit}")
        retries = []
        if self.request_max_retries is not None:
            retries.append(f"request_max_retries = {self.request_max_retries}")
        if self.stream_max_retries is not None:
            retries.append(f"stream_max_retries = {self.stream_max_retries}")
        if self.provider == "openai":
            lines.append(f"openai_base_url = {_quote(self.base_url)}")
            if retries:
                lines += ["", "[model_providers.openai]", *retries]
        elif self.provider == "custom":
            lines[1:1] = [f"model_provider = {_quote(CUSTOM_PROVIDER)}"]
            lines += [
                "",
                f"[model_providers.{CUSTOM_PROVIDER}]",
                'name = "stand-in"',
                f"base_url = {_quote(self.base_url)}",
                f"env_key = {_quote(CUSTOM_KEY_ENV)}",
                'wire_api = "responses"',
                *retries,
            ]
        else:
            raise ValueError(f"unknown provider {self.provider!r}")
        return "\n".join(lines) + "\n"


def _quote(value: str) -> str:
    return orjson.dumps(value).decode()  # a JSON string is a valid TOML basic string


@dataclass
class CodexRun:
    returncode: int | None  # None when killed at the timeout
    events: list[dict[str, Any]]
    stderr: str
    timed_out: bool
    unparsed: list[str] = field(default_factory=list)  # stdout lines that were not JSON

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type") == kind]

    def items(self, item_type: str) -> list[dict[str, Any]]:
        """Completed items of a type (agent_message, command_execution, error, ...)."""
        return [
            e["item"]
            for e in self.of_type("item.completed")
            if isinstance(e.get("item"), dict) and e["item"].get("type") == item_type
        ]

    @property
    def finished(self) -> bool:
        """Codex ended its turn normally (not failed, not killed)."""
        return (
            self.returncode == 0
            and bool(self.of_type("turn.completed"))
            and not self.of_type("turn.failed")
        )

    def summary(self) -> str:
        """A short account of the run for assertion messages."""
        kinds = [e.get("type") for e in self.events]
        failed = self.of_type("turn.failed") + self.of_type("error")
        return (
            f"rc={self.returncode} timed_out={self.timed_out} events={len(kinds)}"
            f" failed={orjson.dumps(failed).decode()[:600]} stderr={self.stderr[-800:]!r}"
        )


def codex_command(
    prompt: str, config: CodexConfig, work_dir: Path, home_dir: Path, api_key: str
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of one run; writes CODEX_HOME/config.toml."""
    home_dir.mkdir(parents=True, exist_ok=True)
    work_dir.mkdir(parents=True, exist_ok=True)
    (home_dir / "config.toml").write_text(config.toml())
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env["CODEX_HOME"] = str(home_dir)
    env["CODEX_API_KEY" if config.provider == "openai" else CUSTOM_KEY_ENV] = api_key
    argv = [
        str(codex_binary()),
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        "--cd",
        str(work_dir),
        prompt,
    ]
    return argv, env


async def run_codex(
    prompt: str,
    config: CodexConfig,
    *,
    work_dir: Path,
    home_dir: Path,
    time_limit: float = 300.0,
    api_key: str = "sk-codex-standin",
) -> CodexRun:
    """Run `codex exec --json` once; the caller's event loop keeps serving meanwhile."""
    argv, env = codex_command(prompt, config, work_dir, home_dir, api_key)
    returncode, stdout, stderr = await run_cli(argv, cwd=work_dir, env=env, time_limit=time_limit)
    events, unparsed = json_lines(stdout)
    return CodexRun(returncode, events, stderr, returncode is None, unparsed)
