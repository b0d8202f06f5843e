"""The reuse cache through a real server: a Claude Code-shaped conversation (its whole
history every turn, the cache marker moved to the newest message, system and tools after
the messages) sent to a proxy with the cache on and to one with it off. The stand-ins
behind them receive the same bytes, request for request, through offloads and folds;
the metrics say the requests were parsed as continuations."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson

from proxy.server.app import RunningProxy
from proxy.server.state import COMPACTOR
from proxy.testing.agent import tool_output
from proxy.testing.standin import StandInOptions
from tests.server.conftest import SMALL_WINDOW, MakeProxy

MakeStandIn = Callable[[StandInOptions], Awaitable[Any]]
HEADERS = {
    "x-api-key": "sk-test-reuse",
    "anthropic-version": "2023-06-01",
    "x-claude-code-session-id": "session-reuse-e2e",
}


def _body(turns: int) -> bytes:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Read the build logs."}]}
    ]
    for n in range(turns):
        call = f"toolu_reuse_{n:03d}"
        command = {"command": f"cat logs/step-{n}.log"}
        messages.append(
            {"role": "assistant", "content": [
                {"type": "text", "text": f"Reading step {n}."},
                {"type": "tool_use", "id": call, "name": "Bash", "input": command},
            ]}
        )  # fmt: skip
        result = {"type": "tool_result", "tool_use_id": call, "content": tool_output(n, 3_000)}
        messages.append({"role": "user", "content": [result]})
    newest = messages[-1]["content"][-1]
    messages[-1]["content"][-1] = {**newest, "cache_control": {"type": "ephemeral"}}
    return orjson.dumps(
        {
            "model": "claude-sonnet-4-5",
            "messages": messages,
            "system": [{"type": "text", "text": "You are a coding agent."}],
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
            "max_tokens": 1024,
        }
    )


async def test_the_cache_changes_nothing_upstream(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy, redis_key_prefix: str
) -> None:
    options = StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None)
    standins = [await make_standin(options), await make_standin(options)]
    proxies: list[RunningProxy] = [
        await make_compacting_proxy(
            standins[0].url, **{"store.key_prefix": redis_key_prefix + "on:"}
        ),
        await make_compacting_proxy(
            standins[1].url,
            **{"store.key_prefix": redis_key_prefix + "off:", "server.reuse_max_bytes": 0},
        ),
    ]
    strategies = []
    async with aiohttp.ClientSession() as session:
        for turns in range(1, 25):
            for proxy in proxies:
                url = proxy.url + "/v1/messages?beta=true"
                async with session.post(url, data=_body(turns), headers=HEADERS) as r:
                    assert r.status == 200, await r.text()
                    strategies.append(r.headers.get("x-compaction-strategy", ""))
                    await r.read()
                await proxy.app[COMPACTOR].settled()  # summaries made ahead: both alike
    sent = [[r.body for r in s.recorded] for s in standins]
    assert len(sent[0]) == len(sent[1])
    for n, (on, off) in enumerate(zip(*sent, strict=True)):
        assert on == off, f"upstream request {n} differs"
    assert {"offload", "checkpoint"} <= set(strategies)
    assert any("summary" in s for s in strategies)
    async with aiohttp.ClientSession() as session, session.get(proxies[0].url + "/metrics") as r:
        metrics = await r.text()
    hits = next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("compaction_proxy_reuse_hits_total")
    )
    assert hits >= 20
    assert proxies[1].app[COMPACTOR].reuse.entries == 0
