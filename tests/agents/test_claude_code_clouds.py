"""The pinned Claude Code in its Bedrock and Vertex AI modes, through the proxy, as a
user runs it (docs/bedrock-vertex.md): skip-auth, the proxy key in
ANTHROPIC_CUSTOM_HEADERS, the base URL the proxy's `/bedrock` or `/vertex/v1` (through
a recording tap). The proxy signs (SigV4) or authorises (a google-auth access token) what
it forwards with its own credentials, and the strict stand-in verifies every request.

The session is the first-party one of test_claude_code.py, longer: 64 Bash turns of
build logs through a small window, the model reading offloaded results now and then, so
the proxy offloads, summarises and merges read rounds into Claude Code's answers (AWS
event streams in Bedrock mode, every frame decoded here). What must hold: every upstream
request valid, authorised and within the window; Claude Code never sees read_result, is
never told more input than the window and never compacts by itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from proxy.config import load_settings
from proxy.server.app import RunningProxy, start
from proxy.store import Store
from proxy.store.accounts import Accounts
from proxy.testing.claude_code import run_claude_code
from proxy.testing.google_oauth import PROJECT, TOKEN_PATH, write_service_account
from proxy.testing.prompt import SUMMARY
from proxy.testing.standin import StandInOptions
from proxy.testing.tap import RunningTap, start_tap
from tests.agents.checks import log_scenario, session_failures, write_logs
from tests.plugins.standin import RunningStandIn


@dataclass(frozen=True)
class Mode:
    name: str
    model: str  # as Claude Code names it in this mode
    small_model: str
    env: dict[str, str]  # Claude Code's settings for the mode ({base} the tap's URL)
    upstream_path: str  # what the stand-in's model calls start with
    client_path: str  # ... and the client's
    model_in_path: str  # the model as the proxy's upstream paths name it

    def settings(self, base: str) -> dict[str, str]:
        return {k: v.replace("{base}", base) for k, v in self.env.items()}


REGION = "us-east5"
BEDROCK = Mode(
    "bedrock",
    "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
    "us.anthropic.claude-haiku-4-5-20251001-v1:0",
    {
        "CLAUDE_CODE_USE_BEDROCK": "1",
        "CLAUDE_CODE_SKIP_BEDROCK_AUTH": "1",
        "ANTHROPIC_BEDROCK_BASE_URL": "{base}/bedrock",
        "AWS_REGION": "us-east-1",
    },
    "/model/",
    "/bedrock/model/",
    "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/",
)
VERTEX = Mode(
    "vertex",
    "claude-sonnet-4-5@20250929",
    "claude-haiku-4-5@20251001",
    {
        "CLAUDE_CODE_USE_VERTEX": "1",
        "CLAUDE_CODE_SKIP_VERTEX_AUTH": "1",
        "ANTHROPIC_VERTEX_BASE_URL": "{base}/vertex/v1",
        "ANTHROPIC_VERTEX_PROJECT_ID": PROJECT,
        "CLOUD_ML_REGION": REGION,
    },
    f"/v1/projects/{PROJECT}/locations/{REGION}/publishers/anthropic/models/",
    "/vertex/v1/projects/",
    "/models/claude-sonnet-4-5@20250929:",
)

FINAL = "All build logs were read: the failure is in src/build/module_7_3.py."
PROMPT = "Read the build logs under logs/ one by one and tell me where the build fails."
TURNS = 64
SMALL_WINDOW = 60_000
CONFIG = f"""
[auth]
keys = "required"
cache_seconds = 0.0

[[policy]]
match = "*"
window = {SMALL_WINDOW}
trigger = 10000
target = 7000
summary_max_tokens = 2000
"""


@dataclass
class CloudStack:
    standin: RunningStandIn
    proxy: RunningProxy
    tap: RunningTap
    key: str  # a proxy key, for Claude Code's custom headers


MakeCloudStack = Callable[[StandInOptions], Awaitable[CloudStack]]


@pytest.fixture
async def cloud_stack(
    make_standin: Callable[[StandInOptions], Awaitable[RunningStandIn]],
    cloud_credentials: Path,
    redis_url: str,
    store: Store,
    tmp_path: Path,
) -> AsyncIterator[MakeCloudStack]:
    """The stand-in, a proxy with keys required and both clouds' upstreams at the
    stand-in, its own credentials in its environment (AWS keys; a service-account file
    whose token endpoint is the stand-in's), and a tap for Claude Code to talk to."""
    started: list[tuple[RunningProxy, RunningTap]] = []

    async def make(options: StandInOptions) -> CloudStack:
        standin = await make_standin(options)
        write_service_account(cloud_credentials, standin.url + TOKEN_PATH)
        config = tmp_path / "proxy.toml"
        config.write_text(CONFIG)
        overrides = {
            "server.port": 0,
            "upstream.url": standin.url,
            "upstream.bedrock_url": standin.url,
            "upstream.vertex_url": standin.url,
            "store.redis_url": redis_url,
            "store.key_prefix": store.prefix,
        }
        settings = await asyncio.to_thread(load_settings, config, {}, overrides)
        proxy = await start(settings)
        tap = await start_tap(proxy.url)
        started.append((proxy, tap))
        key, _ = await Accounts(store).create_key(
            team="cloud", upstream_env="CP_TEST_UNSET_UPSTREAM", upstream_scheme="x-api-key",
            provider="anthropic",
        )  # fmt: skip
        return CloudStack(standin, proxy, tap, key)

    yield make
    for proxy, tap in started:
        await tap.stop()
        await proxy.stop()


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("mode", [BEDROCK, VERTEX], ids=lambda m: m.name)
async def test_claude_code_in_cloud_mode_with_a_small_window(
    cloud_stack: MakeCloudStack, claude_code_cli: list[str], tmp_path: Path, mode: Mode
) -> None:
    """64 Bash turns of ~4,700-token logs through a 60k window; before every fourth turn
    from the seventh on, the model reads two slices of offloaded results. Every result is
    offloaded as it ages, the stubbed history folds into summaries past 10k (the history
    the proxy counts: Claude Code's system prompt and tools come on top). Claude Code is
    sized to compact by itself from ~67k (its smallest CLAUDE_CODE_AUTO_COMPACT_WINDOW):
    told the truth, it never gets there."""
    reads = {n: 2 for n in range(6, TURNS, 4)}
    options = StandInOptions(
        windows={"*": SMALL_WINDOW},
        scenario=log_scenario(TURNS, reads, FINAL),
        max_recorded=None,
    )
    stack = await cloud_stack(options)
    workdir, home = tmp_path / "work", tmp_path / "home"
    workdir.mkdir()
    home.mkdir()
    write_logs(workdir, [12_000] * TURNS)
    env = {
        **mode.settings(stack.tap.url),
        "ANTHROPIC_CUSTOM_HEADERS": f"x-api-key: {stack.key}",
        "ANTHROPIC_SMALL_FAST_MODEL": mode.small_model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": mode.small_model,
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW": "100000",
    }
    run = await run_claude_code(
        claude_code_cli,
        base_url=stack.tap.url,
        prompt=PROMPT,
        workdir=workdir,
        home=home,
        model=mode.model,
        max_turns=TURNS + 10,
        extra_env=env,
        time_limit=1200,
    )
    assert options.scenario is not None
    failures, seen = session_failures(
        scenario=options.scenario,
        options=options,
        recorded=[r for r in stack.standin.recorded if r.path_qs != TOKEN_PATH],
        exchanges=stack.tap.exchanges,
        client_texts=[("output", run.stdout), ("stored files", run.transcripts())],
        window=SMALL_WINDOW,
        min_reads=8,
        upstream_call=lambda path: path.startswith(mode.upstream_path),
        client_call=lambda path: path.startswith(mode.client_path),
    )
    # Streams all the way (a broken event stream makes Claude Code fall back to `invoke`
    # silently), and summaries on the session's own model.
    called = [e.path_qs for e in stack.tap.exchanges if mode.client_path in e.path_qs]
    if mode is BEDROCK and any(not p.endswith("/invoke-with-response-stream") for p in called):
        failures.append(f"Claude Code fell back from the stream: {sorted(set(called))}")
    summaries = [r for r in stack.standin.recorded if r.kind == SUMMARY]
    if any(mode.model_in_path not in r.path_qs for r in summaries):
        failures.append(f"a summary went to another model: {[r.path_qs for r in summaries]}")
    if not seen.kinds[SUMMARY]:
        failures.append("no summary was made (the session did not test folding)")
    if not any("summary" in s for s in seen.strategies):
        failures.append("no fold used a summary")
    if run.returncode != 0:
        failures.append(f"Claude Code exited with {run.returncode}: {run.stderr[-2000:]}")
    if run.final_text != FINAL:
        failures.append(f"Claude Code's final text was {run.final_text[:300]!r}")
    # Every upstream request was the proxy's (authorised with its credential: the
    # stand-in refused anything else) and none carried the proxy key.
    for r in stack.standin.recorded:
        if any(stack.key in value for value in r.headers.values()):
            failures.append(f"the proxy key reached the upstream ({r.path_qs})")
            break
    print(f"observed: {seen}")
    assert not failures, "\n".join(failures)
