"""The real Codex CLI against the stand-in's Responses API, directly and through the proxy.

The stand-in plays the model in scenario mode (ShellChunks: print big.log in 16 chunks with
exec_command, then report) with a 40k window; Codex is told that window and compacts by
itself from the usage in `response.completed`:
- as the built-in provider (`openai_base_url`), against a stand-in playing OpenAI: Codex
  sends a `compaction_trigger` and carries the `compaction` item it gets back;
- as a custom provider: Codex asks for a handoff summary (`tools: []`) and carries the text.
Through today's proxy (`/v1/responses` passed through untouched) Codex, not told the
window, never compacts: the upstream refuses a request over the window and the session
ends (issue 15). That test records the refusal; it changes when the proxy compacts
Responses traffic.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.config import load_settings
from proxy.core.tokens import default_counter
from proxy.server.app import RunningProxy, start
from proxy.testing.codex_cli import CodexConfig, CodexRun, run_codex
from proxy.testing.codex_scenario import DONE_TEXT, ShellChunks, big_log
from proxy.testing.responses_items import ItemCounter, unseal
from proxy.testing.responses_standin import HANDOFF, ResponsesOptions
from proxy.testing.responses_validate import input_items
from proxy.testing.standin import RecordedRequest, StandInOptions
from tests.plugins.responses import MakeResponsesStandIn
from tests.plugins.standin import RunningStandIn

WINDOW = 40_000
COMPACT_AT = 28_000
SCENARIO = ShellChunks(calls=16)
TASK = "SCRIPTED-TASK: print big.log in chunks of lines with the shell, then report."
OUT_OF_ROOM = "ran out of room in the model's context window"

pytestmark = pytest.mark.usefixtures("codex_bin")


@dataclasses.dataclass
class Post:
    record: RecordedRequest
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        metadata = orjson.loads(self.record.headers.get("x-codex-turn-metadata", "{}"))
        return str(metadata.get("request_kind"))

    @property
    def items(self) -> list[Any]:
        return input_items(self.body)


def posts(standin: RunningStandIn) -> list[Post]:
    return [
        Post(r, orjson.loads(r.body))
        for r in standin.recorded
        if r.method == "POST" and r.path_qs == "/v1/responses"
    ]


def gets(standin: RunningStandIn) -> list[RecordedRequest]:
    return [r for r in standin.recorded if r.method == "GET"]


def tokens(post: Post) -> int:
    """The stand-in's count of a request (token_scale 1)."""
    return ItemCounter(default_counter(), ResponsesOptions().seal_key).count_request(post.body)


async def start_standin(make: MakeResponsesStandIn, plays_openai: bool, **extra: Any) -> Any:
    return await make(
        StandInOptions(windows={"*": WINDOW}, max_recorded=None),
        ResponsesOptions(plays_openai=plays_openai, scenario=SCENARIO, **extra),
    )


async def codex_task(tmp_path: Path, base_url: str, provider: str, **config: Any) -> CodexRun:
    work = tmp_path / "work"
    work.mkdir()
    (work / SCENARIO.file).write_text(big_log(SCENARIO.calls * SCENARIO.lines))
    return await run_codex(
        TASK,
        CodexConfig(base_url + "/v1", provider=provider, **config),
        work_dir=work,
        home_dir=tmp_path / "codex-home",
        time_limit=180,
    )


def assert_task_done(run: CodexRun) -> None:
    assert run.finished, run.summary()
    commands = run.items("command_execution")
    assert len(commands) == SCENARIO.calls, run.summary()
    for step, command in enumerate(commands, 1):
        assert command["exit_code"] == 0
        assert f"SCENARIO-STEP={step}\n" in command["aggregated_output"]
    assert DONE_TEXT in run.items("agent_message")[-1]["text"]


def assert_every_request_fits(standin: RunningStandIn, sent: list[Post]) -> None:
    for n, post in enumerate(sent, 1):
        assert post.record.outcome == "complete", n
        assert tokens(post) <= WINDOW, (n, tokens(post))


async def test_codex_builtin_provider_compacts_with_compaction_trigger(
    make_responses_standin: MakeResponsesStandIn, tmp_path: Path
) -> None:
    standin = await start_standin(make_responses_standin, plays_openai=True)
    run = await codex_task(
        tmp_path, standin.url, "openai", context_window=WINDOW, auto_compact_limit=COMPACT_AT
    )
    assert_task_done(run)
    sent = posts(standin)
    assert_every_request_fits(standin, sent)
    # One WebSocket attempt, answered 426: Codex falls back to HTTP at once.
    [websocket] = gets(standin)
    assert websocket.headers.get("Upgrade", "").lower() == "websocket"

    compactions = [n for n, p in enumerate(sent) if p.kind == "compaction"]
    assert compactions, [p.kind for p in sent]
    key = ResponsesOptions().seal_key
    for window_number, n in enumerate(compactions, 1):
        request, after = sent[n], sent[n + 1]
        assert request.items[-1] == {"type": "compaction_trigger"}
        # The same history as the request before it (plus that answer's items), then the trigger.
        previous = sent[n - 1].items
        assert request.items[: len(previous)] == previous
        # The next request starts over: the instructions, the environment and the task,
        # then the one compaction item the stand-in answered, unchanged.
        assert [i.get("type") for i in after.items][-1] == "compaction"
        assert all(i.get("type") == "message" for i in after.items[:-1])
        assert {i["role"] for i in after.items[:-1]} <= {"developer", "user"}
        sealed = unseal(after.items[-1]["encrypted_content"], key)
        assert sealed is not None and "SCENARIO-STEP=" in sealed["text"]
        assert after.record.headers["x-codex-window-id"].endswith(f":{window_number}")
        assert tokens(after) < tokens(request) / 2
    # Codex echoes the stand-in's x-codex-turn-state on every later request of the turn.
    states = {p.record.headers.get("x-codex-turn-state") for p in sent[1:]}
    assert len(states) == 1 and states != {None}


async def test_codex_custom_provider_compacts_with_a_handoff_summary(
    make_responses_standin: MakeResponsesStandIn, tmp_path: Path
) -> None:
    standin = await start_standin(make_responses_standin, plays_openai=False)
    run = await codex_task(
        tmp_path, standin.url, "custom", context_window=WINDOW, auto_compact_limit=COMPACT_AT
    )
    assert_task_done(run)
    sent = posts(standin)
    assert_every_request_fits(standin, sent)
    assert gets(standin) == []  # a custom provider never tries a WebSocket

    compactions = [n for n, p in enumerate(sent) if p.kind == "compaction"]
    assert compactions, [p.kind for p in sent]
    for n in compactions:
        request, after = sent[n], sent[n + 1]
        assert request.body["tools"] == []
        assert all(i.get("type") != "compaction_trigger" for i in request.items)
        last = request.items[-1]
        assert last["role"] == "user" and HANDOFF.search(last["content"][0]["text"])
        summary = [
            i for i in after.items if "SCENARIO-STEP=" in orjson.dumps(i.get("content")).decode()
        ]
        assert len(summary) == 1 and summary[0]["role"] == "user", after.items
        assert tokens(after) < tokens(request) / 2


def proxy_in_front(upstream_url: str, redis_url: str, prefix: str) -> Any:
    settings = load_settings(
        None,
        environ={},
        overrides={
            "server.port": 0,
            "upstream.url": "http://127.0.0.1:9",
            "upstream.openai_url": upstream_url,
            "store.redis_url": redis_url,
            "store.key_prefix": prefix,
        },
    )
    return start(settings)


@pytest.mark.parametrize("overflow", ["stream", "status"])
@pytest.mark.parametrize("provider", ["openai", "custom"])
async def test_through_todays_proxy_codex_runs_out_of_room(
    make_responses_standin: MakeResponsesStandIn,
    tmp_path: Path,
    redis_url: str,
    redis_key_prefix: str,
    provider: str,
    overflow: str,
) -> None:
    standin = await start_standin(
        make_responses_standin, plays_openai=provider == "openai", overflow=overflow
    )
    proxy: RunningProxy = await proxy_in_front(standin.url, redis_url, redis_key_prefix)
    try:
        run = await codex_task(tmp_path, proxy.url, provider)
    finally:
        await proxy.stop()
    assert not run.finished
    assert OUT_OF_ROOM in run.of_type("turn.failed")[-1]["error"]["message"]
    sent = posts(standin)
    sizes = [tokens(p) for p in sent]
    # Passed through untouched: every request fit until one did not, and that one ended it.
    assert all(size <= WINDOW for size in sizes[:-1]), sizes
    assert sizes[-1] > WINDOW, sizes
    assert len(sent) == 7, sizes  # the measurement of issue 15: the 7th request
    assert all(p.kind == "turn" for p in sent)  # Codex never compacted
    if provider == "openai":
        # The proxy drops Upgrade: the stand-in sees plain GETs, answers 404, Codex retries.
        websockets = gets(standin)
        assert len(websockets) > 1
        assert all("Upgrade" not in r.headers for r in websockets)
