"""/metrics and the request log, read the way an operator reads them: over HTTP, after
real traffic from the anthropic SDK through the proxy to the stand-in."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.server.app import RunningProxy
from proxy.server.logs import REQUEST_LOGGER, JSONFormatter
from proxy.server.metrics import METRICS, count_budget_rejection
from proxy.server.state import COMPACTOR
from proxy.testing.agent import run_agent
from proxy.testing.standin import StandInOptions
from tests.server.conftest import MakeProxy

MakeStandIn = Callable[[StandInOptions], Awaitable[Any]]


async def scrape(proxy: RunningProxy) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, by name and labels."""
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: dict[Any, float], name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


PURPOSE = "x-compaction-proxy-purpose"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_metrics_count_what_the_conversation_did(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy, stream: bool
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": 30_000}, max_recorded=None))
    proxy = await make_compacting_proxy(standin.url)
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-metrics", max_retries=0)
    turns = await run_agent(
        client,
        turns=24,
        result_chars=8_000,
        stream=stream,
        read_every=5,
        conversation=f"metrics-{uuid.uuid4().hex}",
    )
    await proxy.app[COMPACTOR].settled()  # summaries made ahead are counted once made
    m = await scrape(proxy)
    p = "compaction_proxy_"

    assert value(m, p + "requests_total", route="/v1/messages", status="200") == len(turns)
    assert value(m, p + "request_duration_seconds_count", route="/v1/messages") == len(turns)
    assert value(m, p + "upstream_latency_seconds_count", route="/v1/messages") == len(turns)
    assert value(m, p + "proxy_overhead_seconds_count", route="/v1/messages") == len(turns)
    assert value(m, p + "proxy_overhead_seconds_sum", route="/v1/messages") > 0

    # Tokens: what the upstream reported for every call made for the client, read_result
    # rounds included (the client itself is told each answer's last round).
    usage = [
        r.usage
        for r in standin.recorded
        if r.path_qs.startswith("/v1/messages") and not r.headers.get(PURPOSE)
    ]
    assert len(usage) > len(turns), "read_result rounds ran"
    assert value(m, p + "input_tokens_total") == sum(u["input_tokens"] for u in usage)
    assert value(m, p + "output_tokens_total") == sum(u["output_tokens"] for u in usage)
    assert value(m, p + "cache_read_tokens_total") == sum(
        u["cache_read_input_tokens"] for u in usage
    )
    assert value(m, p + "cache_write_tokens_total") == sum(
        u["cache_creation_input_tokens"] for u in usage
    )
    assert value(m, p + "cache_read_tokens_total") > 0

    # Rewrites and savings: what the x-compaction-* headers said, turn by turn.
    strategies = [t.headers.get("x-compaction-strategy") for t in turns]
    for strategy in {s for s in strategies if s}:
        said = [t for t in turns if t.headers.get("x-compaction-strategy") == strategy]
        saved = sum(
            int(t.headers["x-compaction-tokens-before"])
            - int(t.headers["x-compaction-tokens-after"])
            for t in said
        )
        assert value(m, p + "rewrites_total", strategy=strategy) == len(said)
        assert value(m, p + "tokens_saved_total", strategy=strategy) == saved
    crossings = [s for s in strategies if s and s != "checkpoint"]
    assert total(m, p + "compactions_total") == len(crossings) >= 1
    assert value(m, p + "offloads_total") >= 1
    said = [t.headers.get("x-compaction-summary") for t in turns]
    for outcome in ("made", "ahead", "waited"):
        assert value(m, p + "summaries_total", outcome=outcome) == said.count(outcome)
    assert said.count("made") + said.count("ahead") + said.count("waited") >= 1
    calls = [r for r in standin.recorded if r.headers.get(PURPOSE) == "summary"]
    assert value(m, p + "summariser_calls_total") == len(calls) >= 1
    assert value(m, p + "summariser_failures_total") == 0
    assert value(m, p + "read_result_rounds_total") >= 1
    assert value(m, p + "requests_in_flight") == 1  # the scrape itself


async def test_summariser_failures_store_errors_and_budget_rejections(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy, embedded_redis: Any
) -> None:
    # The proxy's summariser calls fail with 500 (the client's own requests do not).
    standin = await make_standin(
        StandInOptions(windows={"*": 30_000}, script={"summary_fault": "500"}, max_recorded=None)
    )
    redis = embedded_redis()
    proxy = await make_compacting_proxy(standin.url, redis=redis.url)
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-fail", max_retries=0)
    messages = long_history(turns=12, chars=4_000, chat_chars=600)
    ok = {"x-conversation-id": uuid.uuid4().hex}
    raw = await client.messages.with_raw_response.create(
        model="claude-test-1", max_tokens=64, messages=messages, extra_headers=ok
    )
    assert raw.headers["x-compaction-strategy"] in ("pack", "offload+pack")
    m = await scrape(proxy)
    assert value(m, "compaction_proxy_summariser_calls_total") == 1
    assert value(m, "compaction_proxy_summariser_failures_total") == 1
    assert value(m, "compaction_proxy_store_errors_total") == 0

    redis.stop_sync()
    other = {**ok, "x-conversation-id": uuid.uuid4().hex}
    raw = await client.messages.with_raw_response.create(
        model="claude-test-1", max_tokens=64, messages=messages, extra_headers=other
    )
    assert raw.headers["x-compaction-strategy"] == "pack"
    m = await scrape(proxy)
    assert value(m, "compaction_proxy_store_errors_total") >= 1

    count_budget_rejection(proxy.app, "tokens")
    m = await scrape(proxy)
    assert value(m, "compaction_proxy_budget_rejections_total", reason="tokens") == 1


def long_history(turns: int, chars: int, chat_chars: int, marker: str = "") -> list[dict[str, Any]]:
    """A tool-using conversation: large results and some long assistant text, so
    offloading alone cannot reach the target and old turns must be folded."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Fix the build. {marker}"}]
    for t in range(turns):
        call = f"toolu_{t:04d}"
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Step {t}: {marker} " + "reasoning " * chat_chars},
                    {"type": "tool_use", "id": call, "name": "Bash", "input": {"cmd": f"ls {t}"}},
                ],
            }
        )
        body = f"{marker} line {t}\n" + "".join(f"file_{t}_{i}.py ok\n" for i in range(chars // 14))
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call, "content": body}],
            }
        )
    messages.append({"role": "assistant", "content": "Looked at everything."})
    messages.append({"role": "user", "content": f"Now summarise what you found. {marker}"})
    return messages


async def test_each_app_has_its_own_registry(make_standin: MakeStandIn, make_proxy: Any) -> None:
    standin = await make_standin(StandInOptions())
    first, second = await make_proxy(standin.url), await make_proxy(standin.url)
    client = anthropic.AsyncAnthropic(base_url=first.url, api_key="sk-one", max_retries=0)
    await client.messages.create(
        model="claude-test-1", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    )
    a, b = await scrape(first), await scrape(second)
    assert value(a, "compaction_proxy_requests_total", route="/v1/messages", status="200") == 1
    assert value(b, "compaction_proxy_requests_total", route="/v1/messages", status="200") == 0
    assert first.app[METRICS].registry is not second.app[METRICS].registry


async def test_routes_are_patterns_not_paths(make_standin: MakeStandIn, make_proxy: Any) -> None:
    standin = await make_standin(StandInOptions())
    proxy = await make_proxy(standin.url)
    async with aiohttp.ClientSession() as session:
        for path in ("/v1/models", "/v1/models/a-model", "/v1/anything/else"):
            async with session.get(proxy.url + path) as r:
                await r.read()
        async with session.get(proxy.url + "/healthz") as r:
            assert r.status == 200
    m = await scrape(proxy)
    assert value(m, "compaction_proxy_requests_total", route="other", status="401") == 2
    assert value(m, "compaction_proxy_requests_total", route="other", status="404") == 1
    assert value(m, "compaction_proxy_requests_total", route="/healthz", status="200") == 1
    routes = {dict(labels).get("route") for (_, labels) in m if dict(labels).get("route")}
    assert routes <= {"/v1/messages", "/v1/messages/count_tokens", "/healthz", "/metrics",
                      "/readyz", "other"}  # fmt: skip


@pytest.mark.parametrize("fmt", ["human", "json"])
async def test_one_log_line_per_request(
    make_standin: MakeStandIn,
    make_compacting_proxy: MakeProxy,
    caplog: pytest.LogCaptureFixture,
    fmt: str,
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": 30_000}))
    proxy = await make_compacting_proxy(standin.url, **{"server.log_format": fmt})
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-log", max_retries=0)
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)
    raw = await client.messages.with_raw_response.create(
        model="claude-test-1",
        max_tokens=64,
        messages=long_history(turns=12, chars=4_000, chat_chars=10),
        extra_headers={"x-conversation-id": uuid.uuid4().hex},
    )
    await client.messages.create(
        model="claude-test-1", max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    )
    lines = [r for r in caplog.records if r.name == REQUEST_LOGGER]
    assert len(lines) == 2
    rewritten, plain = (r.fields for r in lines)  # type: ignore[attr-defined]
    assert rewritten["route"] == "/v1/messages" and rewritten["status"] == 200
    assert rewritten["strategy"] == raw.headers["x-compaction-strategy"]
    assert rewritten["tokens_before"] == int(raw.headers["x-compaction-tokens-before"])
    assert rewritten["tokens_after"] == int(raw.headers["x-compaction-tokens-after"])
    assert rewritten["input_tokens"] == (await raw.parse()).usage.input_tokens
    assert rewritten["upstream_request_id"] == raw.headers["request-id"]
    for key in ("request_id", "duration_ms", "proxy_ms", "upstream_ms"):
        assert key in rewritten
    assert plain["strategy"] == "none" and "tokens_before" not in plain
    assert rewritten["request_id"] != plain["request_id"]
    if fmt == "json":
        line = orjson.loads(JSONFormatter().format(lines[0]))
        assert line["level"] == "info" and line["request_id"] == rewritten["request_id"]
        assert line["strategy"] == rewritten["strategy"]
    else:
        text = lines[0].getMessage()
        assert f"request_id={rewritten['request_id']}" in text and "status=200" in text


async def test_chat_completions_are_counted_in_the_same_terms(
    make_standin: MakeStandIn, make_proxy: Any
) -> None:
    import openai

    standin = await make_standin(StandInOptions())
    proxy = await make_proxy(standin.url, **{"upstream.openai_url": standin.url})
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-chat", max_retries=0)
    ask = {"model": "gpt-test-1", "messages": [{"role": "user", "content": "Say hi."}]}
    whole = await client.chat.completions.create(**ask)
    stream = await client.chat.completions.create(
        **ask, stream=True, stream_options={"include_usage": True}
    )
    last = [chunk async for chunk in stream][-1]
    plain = await client.chat.completions.create(**ask, stream=True)
    assert [chunk async for chunk in plain]  # no usage asked for: none counted
    m = await scrape(proxy)
    route = "/v1/chat/completions"
    assert value(m, "compaction_proxy_requests_total", route=route, status="200") == 3
    assert value(m, "compaction_proxy_upstream_latency_seconds_count", route=route) == 3
    usages = [whole.usage, last.usage]
    assert all(u is not None for u in usages)
    prompt = sum(u.prompt_tokens for u in usages if u)
    counted = value(m, "compaction_proxy_input_tokens_total") + value(
        m, "compaction_proxy_cache_read_tokens_total"
    )
    assert counted == prompt
    assert value(m, "compaction_proxy_output_tokens_total") == sum(
        u.completion_tokens for u in usages if u
    )
