"""The real Codex CLI against the stand-in's Responses API, directly and through the proxy.

The stand-in plays the model in scenario mode (ShellChunks: print big.log in 16 chunks with
exec_command, then report) with a 40k window; Codex is told that window and compacts by
itself from the usage in `response.completed`:
- as the built-in provider (`openai_base_url`), against a stand-in playing OpenAI: Codex
  sends a `compaction_trigger` and carries the `compaction` item it gets back;
- as a custom provider: Codex asks for a handoff summary (`tools: []`) and carries the text.
Through the proxy (issue 15), with the same 40k window:
- Codex, not told the window, never compacts by itself; the proxy keeps every request
  within it (before the proxy compacted Responses traffic, the 7th request went over the
  window, the upstream refused it and Codex ended the session);
- Codex, told the window, compacts by itself: both kinds of its compaction request pass
  through the proxy unchanged;
- against an upstream that lacks compaction items, the proxy serves Codex's
  compaction_trigger itself (`[responses] codex_compaction = "serve"`, or "auto").
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
from proxy.server.metrics import METRICS
from proxy.testing.api_responses import HANDOFF, ResponsesOptions
from proxy.testing.codex_cli import CodexConfig, CodexRun, run_codex
from proxy.testing.codex_scenario import DONE_TEXT, ShellChunks, big_log
from proxy.testing.responses_items import ItemCounter, unseal
from proxy.testing.standin import RecordedRequest, StandInOptions
from proxy.wire.responses_units import input_items
from tests.plugins.responses import MakeResponsesStandIn
from tests.plugins.standin import RunningStandIn

WINDOW = 40_000
COMPACT_AT = 28_000
SCENARIO = ShellChunks(calls=16)
TASK = "SCRIPTED-TASK: print big.log in chunks of lines with the shell, then report."

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


async def start_standin(
    make: MakeResponsesStandIn,
    plays_openai: bool,
    script: dict[str, Any] | None = None,
    **extra: Any,
) -> Any:
    return await make(
        StandInOptions(windows={"*": WINDOW}, max_recorded=None, script=script or {}),
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


PROXY_POLICY = {
    "match": "*",
    "window": WINDOW,
    "trigger": 24_000,
    "target": 16_000,
    "keep_last": 2,
    "keep_results": 1,
    "summary_max_tokens": 1_500,
}
# For Codex told the window: the proxy's thresholds above Codex's own compaction limit,
# so Codex compacts first and the proxy only passes its requests through.
LATE_POLICY = {**PROXY_POLICY, "trigger": 36_000, "offload_trigger": 36_000, "target": 20_000}


async def proxy_in_front(
    upstream_url: str,
    redis_url: str,
    prefix: str,
    policy: dict[str, Any] = PROXY_POLICY,
    **settings: Any,
) -> RunningProxy:
    """A proxy whose OpenAI upstream is the stand-in, compacting gpt-* at the stand-in's
    40k window."""
    base = load_settings(
        None,
        environ={},
        overrides={
            "server.port": 0,
            "upstream.url": "http://127.0.0.1:9",
            "upstream.openai_url": upstream_url,
            "store.redis_url": redis_url,
            "store.key_prefix": prefix,
            **settings,
        },
    )
    return await start(dataclasses.replace(base, policies=(policy,)))


def responses_statuses(proxy: RunningProxy) -> dict[str, float]:
    """requests_total on /v1/responses by status, from the proxy's own registry."""
    out: dict[str, float] = {}
    for metric in proxy.app[METRICS].requests.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.labels["route"] == "/v1/responses":
                out[sample.labels["status"]] = out.get(sample.labels["status"], 0) + sample.value
    return out


def codex_items(home: Path) -> list[dict[str, Any]]:
    """Every item Codex kept in its session files: the response items it was given, and
    the history it restarted from after each compaction."""
    items = []
    for path in sorted((home / "sessions").rglob("rollout-*.jsonl")):
        for line in path.read_text().splitlines():
            record = orjson.loads(line)
            if record.get("type") == "response_item":
                items.append(record["payload"])
            elif record.get("type") == "compacted":
                items.extend(record["payload"].get("replacement_history") or ())
    return items


def read_calls(post: Post) -> list[Any]:
    return [
        i for i in post.items if i.get("type") == "function_call" and i["name"] == "read_result"
    ]


@pytest.mark.parametrize("provider", ["openai", "custom"])
async def test_through_the_proxy_codex_finishes_in_a_small_window(
    make_responses_standin: MakeResponsesStandIn,
    tmp_path: Path,
    redis_url: str,
    redis_key_prefix: str,
    provider: str,
) -> None:
    """Codex, not told the window, never compacts by itself: the proxy keeps every
    request within the window (offload, summaries, read_result rounds it answers)."""
    standin = await start_standin(
        make_responses_standin, provider == "openai", script={"read_result": True}
    )
    proxy = await proxy_in_front(standin.url, redis_url, redis_key_prefix)
    try:
        run = await codex_task(tmp_path, proxy.url, provider)
        statuses = responses_statuses(proxy)
    finally:
        await proxy.stop()
    assert_task_done(run)
    sent = posts(standin)
    assert_every_request_fits(standin, sent)
    assert all(p.kind in ("turn", "None") for p in sent)  # Codex never compacted
    # The proxy compacted: stubs went upstream, and it answered read_result itself.
    assert any(
        "compaction-proxy offloaded this result" in orjson.dumps(p.items).decode() for p in sent
    )
    assert any(read_calls(p) for p in sent)
    # ... and Codex never saw one.
    kept = codex_items(tmp_path / "codex-home")
    assert kept and not any(i.get("name") == "read_result" for i in kept)
    assert "read_result" not in orjson.dumps(run.events).decode()
    # Codex closes each stream right after response.completed: complete, not 499.
    assert "499" not in statuses, statuses
    if provider == "openai":
        # Its WebSocket attempt, refused by the upstream (which has none), is answered
        # 426 by the proxy: one try, then HTTP.
        assert statuses.get("426") == 1, statuses
        [upgrade] = gets(standin)
        assert upgrade.status == 426


@pytest.mark.parametrize("provider", ["openai", "custom"])
async def test_codex_compaction_passes_through_the_proxy(
    make_responses_standin: MakeResponsesStandIn,
    tmp_path: Path,
    redis_url: str,
    redis_key_prefix: str,
    provider: str,
) -> None:
    """Codex, told the window, compacts by itself before the proxy needs to: its
    compaction requests go upstream whole (no read_result), and what it gets back comes
    back unchanged (the stand-in's sealed compaction item verifies)."""
    standin = await start_standin(make_responses_standin, plays_openai=provider == "openai")
    proxy = await proxy_in_front(standin.url, redis_url, redis_key_prefix, LATE_POLICY)
    try:
        run = await codex_task(
            tmp_path, proxy.url, provider, context_window=WINDOW, auto_compact_limit=COMPACT_AT
        )
    finally:
        await proxy.stop()
    assert_task_done(run)
    sent = posts(standin)
    assert_every_request_fits(standin, sent)
    compactions = [n for n, p in enumerate(sent) if p.kind == "compaction"]
    assert compactions, [p.kind for p in sent]
    key = ResponsesOptions().seal_key
    for n in compactions:
        request, after = sent[n], sent[n + 1]
        assert not read_calls(request)
        assert all(t.get("name") != "read_result" for t in request.body["tools"])
        if provider == "openai":
            assert request.items[-1] == {"type": "compaction_trigger"}
            assert after.items[-1]["type"] == "compaction"
            assert unseal(after.items[-1]["encrypted_content"], key) is not None
        else:
            assert request.body["tools"] == []
            assert HANDOFF.search(request.items[-1]["content"][0]["text"])


@pytest.mark.parametrize("mode", ["serve", "auto"])
async def test_the_proxy_serves_codex_compaction_for_an_upstream_that_lacks_it(
    make_responses_standin: MakeResponsesStandIn,
    tmp_path: Path,
    redis_url: str,
    redis_key_prefix: str,
    mode: str,
) -> None:
    """The built-in provider against a Responses server that knows no compaction items:
    the proxy answers compaction_trigger with its own sealed item (auto: after the
    upstream refused the first one) and puts the summary back in later requests."""
    standin = await start_standin(make_responses_standin, plays_openai=False)
    proxy = await proxy_in_front(
        standin.url,
        redis_url,
        redis_key_prefix,
        LATE_POLICY,
        **{"responses.codex_compaction": mode},
    )
    try:
        run = await codex_task(
            tmp_path, proxy.url, "openai", context_window=WINDOW, auto_compact_limit=COMPACT_AT
        )
    finally:
        await proxy.stop()
    assert_task_done(run)
    sent = posts(standin)
    assert_every_request_fits(standin, sent)
    triggers = [p for p in sent if p.items and p.items[-1].get("type") == "compaction_trigger"]
    assert len(triggers) == (1 if mode == "auto" else 0)  # auto: the one the upstream refused
    summaries = [p for p in sent if p.record.headers.get("x-compaction-proxy-purpose")]
    assert summaries
    sent = [p for p in sent if p not in summaries]  # Codex's own requests
    windows = {p.record.headers["x-codex-window-id"].rsplit(":", 1)[1] for p in sent}
    assert len(windows) > 1  # Codex went on in a new window after compacting
    for post in sent:
        assert all(i.get("type") != "compaction" for i in post.items)  # never forwarded
    restarted = [p for p in sent if p.record.headers["x-codex-window-id"].endswith(":1")]
    text = orjson.dumps(restarted[0].items).decode()
    assert "[compaction-proxy: summary of the conversation" in text
    assert "SCENARIO-STEP=" in text
    # Codex restarted from the proxy's sealed item.
    kept = codex_items(tmp_path / "codex-home")
    sealed = [i for i in kept if i.get("type") == "compaction"]
    assert sealed and all(i["encrypted_content"].startswith("cpx1.") for i in sealed)
