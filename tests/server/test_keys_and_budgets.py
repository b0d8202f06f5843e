"""Proxy keys and budgets through one proxy: the anthropic SDK -> the proxy -> the stand-in."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest

from proxy.core.budget import Amounts
from proxy.core.identity import credential
from proxy.server.app import RunningProxy
from proxy.store import Store
from proxy.store.accounts import Accounts, Scope
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import MakeProxy
from tests.server.test_disconnect_and_store import eventually

UPSTREAM_SECRET = "sk-upstream-budget-tests"
ENV = "CP_TEST_UPSTREAM_KEY"
REQUEST: dict[str, Any] = {
    "model": "claude-haiku-4-5",
    "max_tokens": 200,
    "messages": [{"role": "user", "content": "Say something short."}],
}


@pytest.fixture
async def keyed(
    monkeypatch: pytest.MonkeyPatch,
    standin: RunningStandIn,
    make_proxy: MakeProxy,
    store: Store,
) -> AsyncIterator[tuple[RunningProxy, Accounts]]:
    monkeypatch.setenv(ENV, UPSTREAM_SECRET)
    proxy = await make_proxy(
        standin.url,
        **{
            "auth.keys": "required",
            "auth.cache_seconds": 0.0,
            "store.key_prefix": store.prefix,
            "upstream.openai_url": standin.url,
        },
    )
    yield proxy, Accounts(store)


async def new_key(
    accounts: Accounts,
    team: str = "team-a",
    provider: str = "anthropic",
    scopes: tuple[str, ...] = (),
    **limits: int,
) -> tuple[str, str]:
    scheme = "bearer" if provider == "openai" else "x-api-key"
    text, record = await accounts.create_key(
        team=team, upstream_env=ENV, upstream_scheme=scheme, provider=provider, scopes=scopes
    )
    if limits:
        await accounts.set_conf(Scope("key", record["id"]), dict(limits))  # type: ignore[arg-type]
    return text, record["id"]


def client(proxy: RunningProxy, key: str, **options: Any) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=proxy.url, api_key=key, max_retries=0, **options)


async def usage_of(accounts: Accounts, scope: Scope, period: str = "day") -> dict[str, int]:
    return (await accounts.usage(scope, time.time()))[period]


async def settled(accounts: Accounts, scope: Scope, check: Any, seconds: float = 10) -> bool:
    """Settlement runs after the answer: poll until `check(usage)` holds."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check(await usage_of(accounts, scope)):
            return True
        await asyncio.sleep(0.02)
    return False


async def test_missing_wrong_and_revoked_keys_get_401(
    keyed: tuple[RunningProxy, Accounts], standin: RunningStandIn
) -> None:
    proxy, accounts = keyed
    text, key_id = await new_key(accounts)
    for bad in ("sk-ant-not-a-proxy-key", text[:-1] + ("A" if text[-1] != "A" else "B")):
        async with client(proxy, bad) as c:
            with pytest.raises(anthropic.AuthenticationError) as caught:
                await c.messages.create(**REQUEST)
        assert caught.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    async with aiohttp.ClientSession() as session:
        response = await session.post(f"{proxy.url}/v1/messages", json=REQUEST)
        assert response.status == 401
        assert (await response.json())["error"]["type"] == "authentication_error"
    async with client(proxy, text) as c:
        await c.messages.create(**REQUEST)
        assert await accounts.revoke_key(key_id)
        with pytest.raises(anthropic.AuthenticationError):
            await c.messages.create(**REQUEST)
    assert len(standin.recorded) == 1  # only the good request reached the upstream


async def test_the_upstream_sees_the_mapped_credential_never_the_proxy_key(
    keyed: tuple[RunningProxy, Accounts], standin: RunningStandIn
) -> None:
    proxy, accounts = keyed
    text, _ = await new_key(accounts, scopes=("models",))
    async with client(proxy, text) as c:
        await c.messages.create(**REQUEST)
        await c.messages.count_tokens(model=REQUEST["model"], messages=REQUEST["messages"])
        assert [m.id async for m in c.models.list()]
    bearer = anthropic.AsyncAnthropic(base_url=proxy.url, auth_token=text, max_retries=0)
    async with bearer:
        await bearer.messages.create(**REQUEST)
    assert len(standin.recorded) == 4
    for record in standin.recorded:
        assert record.headers.get("x-api-key") == UPSTREAM_SECRET
        assert not any(text in value for value in record.headers.values())


async def test_over_budget_is_a_429_with_retry_after(
    keyed: tuple[RunningProxy, Accounts], standin: RunningStandIn
) -> None:
    proxy, accounts = keyed
    # Each request reserves max_tokens (200) of output: two fit in 450, a third does not
    # while they are held, and once settled (a short answer) there is room again.
    # A day budget: a minute one would let a test that straddles a minute pass.
    text, key_id = await new_key(accounts, **{"day:output": 450})
    async with client(proxy, text) as c:
        script = {"x-stand-in": '{"fault": "stall", "stall_seconds": 2}'}
        slow = [
            asyncio.create_task(c.messages.create(**REQUEST, extra_headers=script))
            for _ in range(2)
        ]
        assert await eventually(lambda: len(standin.recorded) == 2)
        with pytest.raises(anthropic.RateLimitError) as caught:
            await c.messages.create(**REQUEST)
        retry_after = int(caught.value.response.headers["retry-after"])
        assert 1 <= retry_after <= 86_400
        assert "day budget of 450 output tokens" in caught.value.message
        await asyncio.gather(*slow)
        assert await settled(accounts, Scope("key", key_id), lambda u: 0 < u["output"] <= 100)
        await c.messages.create(**REQUEST)
    assert len(standin.recorded) == 3


async def test_a_team_budget_binds_all_its_keys(keyed: tuple[RunningProxy, Accounts]) -> None:
    proxy, accounts = keyed
    await accounts.set_conf(Scope("team", "team-b"), {"day:input": 10})
    first, _ = await new_key(accounts, team="team-b")
    second, _ = await new_key(accounts, team="team-b")
    async with client(proxy, first) as c:
        await c.messages.create(**REQUEST)  # about 8 input tokens: fits
    async with client(proxy, second) as c:
        with pytest.raises(anthropic.RateLimitError) as caught:
            await c.messages.create(**REQUEST)
    assert "team team-b's day budget" in caught.value.message


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_usage_settles_to_what_the_upstream_reported(
    keyed: tuple[RunningProxy, Accounts], stream: bool
) -> None:
    proxy, accounts = keyed
    text, key_id = await new_key(accounts, **{"day:input": 10**6, "day:output": 10**6})
    reported = Amounts()
    async with client(proxy, text) as c:
        for n in range(3):
            body = {**REQUEST, "messages": [{"role": "user", "content": "word " * (50 * n + 1)}]}
            if stream:
                async with c.messages.stream(**body) as s:
                    message = await s.get_final_message()
            else:
                message = await c.messages.create(**body)
            u = message.usage
            spent = u.input_tokens + (u.cache_read_input_tokens or 0)
            spent += u.cache_creation_input_tokens or 0
            reported = reported.plus(Amounts(spent, u.output_tokens, 0))
    scope = Scope("key", key_id)
    assert await settled(
        accounts,
        scope,
        lambda u: (u["input"], u["output"]) == (reported.input, reported.output),
    )


async def test_upstream_errors_refund_the_reservation(
    keyed: tuple[RunningProxy, Accounts], standin: RunningStandIn
) -> None:
    proxy, accounts = keyed
    text, key_id = await new_key(accounts, **{"day:output": 10_000})
    async with client(proxy, text) as c:
        for fault in ("529", "429"):
            with pytest.raises(anthropic.APIStatusError):
                await c.messages.create(
                    **REQUEST, extra_headers={"x-stand-in": f'{{"fault": "{fault}"}}'}
                )
    assert len(standin.recorded) == 2
    assert await settled(accounts, Scope("key", key_id), lambda u: u["output"] == 0)


async def test_a_disconnect_mid_stream_settles_what_was_streamed(
    keyed: tuple[RunningProxy, Accounts], standin: RunningStandIn
) -> None:
    proxy, accounts = keyed
    text, key_id = await new_key(accounts, **{"day:output": 100_000})
    body = {**REQUEST, "max_tokens": 4000, "stream": True}
    script = orjson.dumps({"text": "token " * 1200, "token_delay": 0.02, "chunk_tokens": 2})
    headers = {"x-api-key": text, "anthropic-version": "2023-06-01", "x-stand-in": script.decode()}
    async with aiohttp.ClientSession() as session:
        response = await session.post(f"{proxy.url}/v1/messages", json=body, headers=headers)
        seen = b""
        while seen.count(b"content_block_delta") < 20:
            chunk = await response.content.readany()
            assert chunk, "the stream ended before the client left"
            seen += chunk
        response.close()  # the client goes away mid-answer
    assert await settled(accounts, Scope("key", key_id), lambda u: 0 < u["output"] < 4000)
    assert (await usage_of(accounts, Scope("key", key_id)))["input"] > 0
    assert standin.recorded[-1].outcome == "cancelled"


async def test_a_key_policy_overrides_the_model_policy(
    keyed: tuple[RunningProxy, Accounts], standin: RunningStandIn
) -> None:
    proxy, accounts = keyed
    text, key_id = await new_key(accounts)
    history: list[dict[str, Any]] = []
    for n in range(30):
        history.append({"role": "user", "content": f"Question {n}: " + "detail " * 60})
        history.append({"role": "assistant", "content": f"Answer {n}: " + "fact " * 60})
    history.append({"role": "user", "content": "And now?"})
    body = {**REQUEST, "messages": history}
    async with client(proxy, text) as c:
        plain = await c.messages.with_raw_response.create(**body)
        assert "x-compaction-strategy" not in plain.headers
        await accounts.set_conf(
            Scope("key", key_id),
            {"policy:window": 6000, "policy:trigger": 3000, "policy:target": 1500},
        )
        small = await c.messages.with_raw_response.create(**body)
    assert small.headers["x-compaction-strategy"] in ("summary", "pack", "offload+summary")
    assert int(small.headers["x-compaction-tokens-after"]) <= 3000


async def test_chat_completions_go_through_the_same_keys_and_budgets(
    keyed: tuple[RunningProxy, Accounts], standin: RunningStandIn
) -> None:
    proxy, accounts = keyed
    text, key_id = await new_key(accounts, provider="openai", **{"day:output": 150})
    chat = {"model": "gpt-4o", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
    base = proxy.url + "/v1"
    async with openai.AsyncOpenAI(base_url=base, api_key="sk-wrong", max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError) as denied:
            await wrong.chat.completions.create(**chat)
    assert denied.value.body["type"] == "authentication_error"  # type: ignore[index]
    async with openai.AsyncOpenAI(base_url=base, api_key=text, max_retries=0) as c:
        answer = await c.chat.completions.create(**chat)
        assert answer.usage is not None
        spent = answer.usage.completion_tokens
        assert await settled(accounts, Scope("key", key_id), lambda u: u["output"] == spent)
        with pytest.raises(openai.RateLimitError) as limited:  # 140 more do not fit
            await c.chat.completions.create(**{**chat, "max_tokens": 140})
    assert int(limited.value.response.headers["retry-after"]) >= 1
    assert "day budget of 150 output tokens" in limited.value.message
    (record,) = [r for r in standin.recorded if r.path_qs.startswith("/v1/chat")]
    assert credential({k.lower(): v for k, v in record.headers.items()}) == UPSTREAM_SECRET
