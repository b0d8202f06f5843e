"""read_result rounds inside a budget: each round holds its own reservation before it
goes upstream, and a round the budget cannot hold is not sent.

The anthropic SDK -> the proxy (proxy keys, a compaction policy that offloads) -> the
stand-in, whose read_result script makes the model read the first stub it sees.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import orjson
import pytest

from proxy.server.app import RunningProxy, start
from proxy.store import Store
from proxy.store.accounts import Accounts, Scope
from proxy.testing.agent import tool_output
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import proxy_settings
from tests.server.test_keys_and_budgets import ENV, UPSTREAM_SECRET, new_key, settled, usage_of

MAX_TOKENS = 1_000
PURPOSE = "x-compaction-proxy-purpose"  # marks the summariser's calls
# A window small enough that the history below is rewritten, with its results offloaded.
POLICY = {
    "match": "*",
    "window": 30_000,
    "trigger": 20_000,
    "target": 8_000,
    "keep_results": 1,
    "offload_threshold": 500,
    "stub_head_chars": 600,
}
READ_SCRIPT = {"x-stand-in": '{"read_result": true, "text": "read it"}'}


@pytest.fixture
async def keyed_compacting(
    monkeypatch: pytest.MonkeyPatch, standin: RunningStandIn, redis_url: str, store: Store
) -> AsyncIterator[tuple[RunningProxy, Accounts]]:
    monkeypatch.setenv(ENV, UPSTREAM_SECRET)
    settings = proxy_settings(
        standin.url,
        redis_url,
        **{"auth.keys": "required", "auth.cache_seconds": 0.0, "store.key_prefix": store.prefix},
    )
    proxy = await start(dataclasses.replace(settings, policies=(POLICY,)))
    yield proxy, Accounts(store)
    await proxy.stop()


def tool_history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the build."}]
    for t in range(turns):
        call = {"type": "tool_use", "id": f"toolu_b{t}", "name": "Bash", "input": {"n": t}}
        result = {
            "type": "tool_result",
            "tool_use_id": f"toolu_b{t}",
            "content": tool_output(t, 8_000),
        }
        messages += [
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [result]},
        ]
    return messages


def reported(standin: RunningStandIn) -> list[dict[str, Any]]:
    """The usage the stand-in reported for each upstream call made for the client."""
    return [
        r.usage
        for r in standin.recorded
        if r.path_qs.startswith("/v1/messages") and not r.headers.get(PURPOSE)
    ]


def turns(standin: RunningStandIn) -> list[dict[str, Any]]:
    """The upstream Messages calls made for the client (no summariser calls)."""
    return [
        orjson.loads(r.body)
        for r in standin.recorded
        if r.path_qs.startswith("/v1/messages") and not r.headers.get(PURPOSE)
    ]


async def ask(proxy: RunningProxy, key: str, stream: bool) -> tuple[Any, dict[str, str]]:
    request: dict[str, Any] = {
        "model": "claude-test-1",
        "max_tokens": MAX_TOKENS,
        "messages": tool_history(12),
        "extra_headers": READ_SCRIPT,
    }
    async with anthropic.AsyncAnthropic(base_url=proxy.url, api_key=key, max_retries=0) as c:
        if stream:
            async with c.messages.stream(**request) as s:
                return await s.get_final_message(), dict(s.response.headers)
        raw = await c.messages.with_raw_response.create(**request)
        return await raw.parse(), dict(raw.headers)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_round_the_budget_cannot_hold_is_not_sent(
    keyed_compacting: tuple[RunningProxy, Accounts], standin: RunningStandIn, stream: bool
) -> None:
    """The first call holds MAX_TOKENS of output; the read round would hold as much
    again, over the 1.5x budget: the proxy stops there and ends the message cleanly."""
    proxy, accounts = keyed_compacting
    text, key_id = await new_key(accounts, **{"day:output": MAX_TOKENS * 3 // 2})
    message, headers = await ask(proxy, text, stream)

    sent = turns(standin)
    assert len(sent) == 1, "the read_result round went upstream over the budget"
    assert any(t["name"] == "read_result" for t in sent[0]["tools"])  # it was offered
    assert message.stop_reason == "end_turn"
    assert all(b.type != "tool_use" for b in message.content)  # the held call stays hidden
    # The message says why it ends there (a valid, non-empty answer either way).
    assert "token budget" in message.content[-1].text
    assert headers["x-compaction-strategy"].startswith("offload")
    if not stream:
        assert headers["x-compaction-read-rounds"] == "0"
    # Settled to the one call's reported usage, within the budget.
    scope = Scope("key", key_id)
    (usage,) = reported(standin)
    assert await settled(accounts, scope, lambda u: u["output"] == usage["output_tokens"])
    assert (await usage_of(accounts, scope))["output"] <= MAX_TOKENS * 3 // 2


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_rounds_the_budget_can_hold_run_and_settle_to_their_sum(
    keyed_compacting: tuple[RunningProxy, Accounts], standin: RunningStandIn, stream: bool
) -> None:
    proxy, accounts = keyed_compacting
    text, key_id = await new_key(accounts, **{"day:output": MAX_TOKENS * 5 // 2})
    message, headers = await ask(proxy, text, stream)

    sent = turns(standin)
    assert len(sent) == 2  # the first call and one read round
    assert "read it" in "".join(b.text for b in message.content if b.type == "text")
    assert message.stop_reason == "end_turn"
    if not stream:
        assert headers["x-compaction-read-rounds"] == "1"
    # Both reservations are given back and replaced by the rounds' summed usage (the
    # client is told the last round's input: what the model saw last).
    scope = Scope("key", key_id)
    rounds = reported(standin)
    output = sum(r["output_tokens"] for r in rounds)
    total_input = sum(
        r["input_tokens"] + r["cache_read_input_tokens"] + r["cache_creation_input_tokens"]
        for r in rounds
    )
    assert await settled(
        accounts,
        scope,
        lambda used: used["output"] == output and used["input"] == total_input,
    )
    last = rounds[-1]
    u = message.usage
    told = u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)
    fields = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    assert told == sum(last[f] for f in fields)  # a stream may move a token between fields
    assert 0 < u.output_tokens <= output
