"""Real agent CLIs through a real proxy, against the stand-in upstream.

- `claude_code_cli`, `gemini_cli` and `codex_bin` (session): the pinned Claude Code,
  Gemini and Codex CLIs, installed first with `npm ci` in this folder when node_modules
  is missing or stale (CI's .ci/run does the same up front); `$CODEX_BIN` overrides the
  Codex binary.
- `agent_stack(options, config_toml)`: the stand-in with `options` on a loopback port, a
  proxy started from the TOML config (as `serve` reads it; its Redis keys under the
  test's prefix), and a recording tap in front of the proxy for the agent to talk to.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxy.config import load_settings
from proxy.server.app import RunningProxy, start
from proxy.testing.agent_install import install
from proxy.testing.claude_code import claude_command
from proxy.testing.codex_cli import codex_binary
from proxy.testing.gemini_cli import gemini_command
from proxy.testing.standin import StandInOptions
from proxy.testing.tap import RunningTap, start_tap
from tests.plugins.standin import RunningStandIn

AGENTS = Path(__file__).parent


@pytest.fixture(scope="session")
def claude_code_cli() -> list[str]:
    install(AGENTS)
    return claude_command(AGENTS)


@pytest.fixture(scope="session")
def gemini_cli() -> list[str]:
    install(AGENTS)
    return gemini_command(AGENTS)


@pytest.fixture(scope="session")
def codex_bin() -> Path:
    if "CODEX_BIN" not in os.environ:
        install(AGENTS)
    binary = codex_binary()
    assert binary.exists(), f"no Codex CLI at {binary}"
    version = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, check=True, timeout=60
    )
    assert version.stdout.startswith("codex-cli "), version.stdout
    return binary


@dataclass
class AgentStack:
    standin: RunningStandIn
    proxy: RunningProxy
    tap: RunningTap

    @property
    def url(self) -> str:
        """Where the agent points its base URL: the tap, in front of the proxy."""
        return self.tap.url


MakeStack = Callable[[StandInOptions, str], Awaitable[AgentStack]]


@pytest.fixture
async def agent_stack(
    make_standin: Callable[[StandInOptions], Awaitable[RunningStandIn]],
    redis_url: str,
    redis_key_prefix: str,
    tmp_path: Path,
) -> AsyncIterator[MakeStack]:
    started: list[tuple[RunningProxy, RunningTap]] = []

    async def make(options: StandInOptions, config_toml: str) -> AgentStack:
        standin = await make_standin(options)
        config = tmp_path / f"proxy-{len(started)}.toml"
        config.write_text(config_toml)
        settings = await asyncio.to_thread(
            load_settings,
            config,
            {},
            {
                "server.port": 0,
                "upstream.url": standin.url,
                "upstream.gemini_url": standin.url,
                "store.redis_url": redis_url,
                "store.key_prefix": redis_key_prefix,
            },
        )
        proxy = await start(settings)
        tap = await start_tap(proxy.url)
        started.append((proxy, tap))
        return AgentStack(standin, proxy, tap)

    yield make
    for proxy, tap in started:
        await tap.stop()
        await proxy.stop()
