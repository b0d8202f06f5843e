"""The admin API as an operator's script uses it: over HTTP, against a proxy with real
traffic from the anthropic and openai SDKs to the stand-in, and a real Redis."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import redis

from proxy.cli import main
from proxy.config import ConfigError, load_settings
from proxy.core.pricing import CACHE_MODEL
from proxy.server.admin.access import AdminKey
from proxy.store import EmbeddedRedis
from proxy.store.keys import scan_pattern
from proxy.testing.agent import run_agent
from proxy.testing.standin import StandInOptions
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import (
    ADMIN_KEY_ENV,
    UPSTREAM_KEY_ENV,
    AdminAPI,
    MakeProxy,
)
from tests.server.test_metrics import MakeStandIn, scrape, total

REQUEST: dict[str, Any] = {
    "model": "claude-haiku-4-5",
    "max_tokens": 100,
    "messages": [{"role": "user", "content": "Say something short."}],
}


def client(proxy: Any, key: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=proxy.url, api_key=key, max_retries=0)


async def new_key(api: AdminAPI, team: str = "infra", **fields: Any) -> dict[str, Any]:
    body = {"team": team, "upstream_env": UPSTREAM_KEY_ENV, **fields}
    created: dict[str, Any] = await api.ok("POST", "/admin/keys", body)
    return created


async def until(check: Callable[[], Awaitable[bool]], seconds: float = 10) -> None:
    """Poll an async condition until it holds (bounded; not a timing check)."""
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.05)


async def stats_when(api: AdminAPI, ready: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """/admin/stats once `ready` holds (other replicas send theirs within a second)."""
    found: dict[str, Any] = {}

    async def check() -> bool:
        nonlocal found
        found = await api.ok("GET", "/admin/stats")
        return ready(found)

    await until(check)
    return found


async def test_without_an_admin_key_admin_paths_are_404_and_never_forwarded(
    standin: RunningStandIn, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(standin.url)
    api = AdminAPI(proxy.url, "anything-at-all-here")
    for method, path in (
        ("GET", "/admin/keys"),
        ("POST", "/admin/keys"),
        ("GET", "/admin/stats"),
        ("GET", "/admin"),
        ("GET", "/dashboard"),
        ("GET", "/dashboard/app.js"),
    ):
        status, body = await api.call(method, path)
        assert status == 404, path
        assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert standin.recorded == []


async def test_every_admin_path_needs_the_admin_key(
    standin: RunningStandIn, make_admin_proxy: MakeProxy, admin_key: str
) -> None:
    proxy = await make_admin_proxy(standin.url)
    api = AdminAPI(proxy.url, admin_key)
    proxy_key = (await new_key(api))["key"]
    refused = {
        "none": {},
        "wrong": {"Authorization": f"Bearer {admin_key}x"},
        "as x-api-key": {"x-api-key": admin_key},
        "a proxy key": {"Authorization": f"Bearer {proxy_key}"},
        "basic": {"Authorization": f"Basic {admin_key}"},
    }
    for method, path in (
        ("GET", "/admin/stats"),
        ("GET", "/admin/keys"),
        ("POST", "/admin/keys"),
        ("DELETE", "/admin/keys/0123456789ab"),
        ("GET", "/admin/budgets"),
        ("PUT", "/admin/budgets/team/infra"),
        ("PATCH", "/admin/keys"),
        ("GET", "/admin/no-such-thing"),
        ("GET", "/admin"),
    ):
        for name, headers in refused.items():
            status, body = await api.call(method, path, {"team": "x"}, headers=headers)
            assert status == 401, (method, path, name)
            assert body["error"]["type"] == "authentication_error"
    status, body = await api.call("GET", "/admin/keys", headers=refused["a proxy key"])
    assert body["error"]["message"] == "a proxy key is not the admin key"
    assert (await api.call("PATCH", "/admin/keys"))[0] == 405
    assert (await api.call("GET", "/admin/no-such-thing"))[0] == 404
    assert standin.recorded == []  # nothing of it went upstream
    metrics = await scrape(proxy)
    assert metrics[("compaction_proxy_budget_rejections_total", (("reason", "admin"),))] >= 45


async def test_a_key_made_over_http_works_and_its_revocation_is_401(
    standin: RunningStandIn, make_admin_proxy: MakeProxy, admin_key: str
) -> None:
    proxy = await make_admin_proxy(standin.url)
    api = AdminAPI(proxy.url, admin_key)
    status, created = await api.call(
        "POST", "/admin/keys", {"team": "infra", "name": "ci bot", "upstream_env": UPSTREAM_KEY_ENV}
    )
    assert status == 201 and created["key"].startswith("cpk_" + created["id"])
    assert "digest" not in created
    listed = (await api.ok("GET", "/admin/keys"))["keys"]
    assert [(k["id"], k["team"], k["name"], k["revoked"]) for k in listed] == [
        (created["id"], "infra", "ci bot", "0")
    ]
    assert all("digest" not in k and created["key"] not in str(k) for k in listed)

    async with client(proxy, created["key"]) as c:
        await c.messages.create(**REQUEST)
        revoked = await api.ok("DELETE", f"/admin/keys/{created['id']}")
        assert revoked == {"revoked": created["id"], "effective_within_seconds": 0.0}
        with pytest.raises(anthropic.AuthenticationError):
            await c.messages.create(**REQUEST)
    assert (await api.ok("GET", "/admin/keys"))["keys"][0]["revoked"] == "1"
    assert len(standin.recorded) == 1
    status, body = await api.call("DELETE", "/admin/keys/0123456789ab")
    assert status == 404 and body["error"]["type"] == "not_found_error"
    status, body = await api.call("DELETE", "/admin/keys/not-an-id")
    assert status == 400 and "key id" in body["error"]["message"]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"team": "bad team"}, "team"),
        ({}, "team"),
        ({"team": "a", "colour": "blue"}, "colour"),
        ({"team": "a", "provider": "acme"}, "provider"),
        ({"team": "a", "scopes": ["everything"]}, "scopes"),
        ({"team": "a", "scopes": "messages"}, "scopes"),
        ({"team": "a", "upstream_env": "lower-case"}, "environment variable"),
        ({"team": "a", "upstream_scheme": "basic"}, "scheme"),
        ({"team": "a", "tenant": "{x}"}, "tenant"),
        ({"team": "a", "policy": {"window": -1}}, "policy.window"),
        ({"team": "a", "policy": {"size": 9}}, "size"),
        (["team"], "JSON object"),
    ],
)
async def test_key_requests_are_checked_field_by_field(
    standin: RunningStandIn,
    make_admin_proxy: MakeProxy,
    admin_key: str,
    body: Any,
    named: str,
) -> None:
    proxy = await make_admin_proxy(standin.url)
    api = AdminAPI(proxy.url, admin_key)
    status, answer = await api.call("POST", "/admin/keys", body)
    assert status == 400 and answer["error"]["type"] == "invalid_request_error"
    assert named in answer["error"]["message"]
    assert (await api.ok("GET", "/admin/keys"))["keys"] == []


async def test_provider_scopes_and_a_shared_tenant(
    make_standin: MakeStandIn,
    make_admin_proxy: MakeProxy,
    admin_key: str,
    redis_url: str,
    redis_key_prefix: str,
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": 30_000}))
    proxy = await make_admin_proxy(standin.url)
    api = AdminAPI(proxy.url, admin_key)
    only_messages = await new_key(api, provider="anthropic")  # no scope: metered routes
    assert (only_messages["provider"], only_messages["scopes"]) == ("anthropic", "")
    assert only_messages["upstream_scheme"] == "x-api-key"
    async with client(proxy, only_messages["key"]) as c:
        await c.messages.create(**REQUEST)
        with pytest.raises(anthropic.PermissionDeniedError) as caught:
            await c.models.list()
        assert "needs the scope 'models'" in caught.value.message
    with_models = await new_key(api, scopes=["models"])
    async with client(proxy, with_models["key"]) as c:
        assert [m.id async for m in c.models.list()]
    chat = openai.AsyncOpenAI(
        base_url=proxy.url + "/v1", api_key=only_messages["key"], max_retries=0
    )
    async with chat:
        with pytest.raises(openai.PermissionDeniedError) as refused:
            await chat.chat.completions.create(
                model="gpt-4.1", messages=[{"role": "user", "content": "hi"}]
            )
    assert "for the Anthropic API" in refused.value.message
    assert len(standin.recorded) == 2

    shared = [await new_key(api, tenant="research") for _ in range(2)]
    assert {k["tenant"] for k in shared} == {"research"}
    async with client(proxy, shared[0]["key"]) as c:  # big enough to be offloaded
        await run_agent(c, turns=12, result_chars=8_000, conversation=f"t-{uuid.uuid4().hex}")
    names = redis.Redis.from_url(redis_url)
    try:
        stored = [k.decode() for k in names.scan_iter(match=scan_pattern(redis_key_prefix))]
    finally:
        names.close()
    assert any("{nresearch:" in k for k in stored), stored
    assert not any(f"{{k{shared[0]['id']}:" in k for k in stored)


async def test_budgets_over_http(
    standin: RunningStandIn, make_admin_proxy: MakeProxy, admin_key: str
) -> None:
    proxy = await make_admin_proxy(standin.url)
    api = AdminAPI(proxy.url, admin_key)
    key = await new_key(api, team="web")
    path = f"/admin/budgets/key/{key['id']}"
    report = await api.ok(
        "PUT",
        path,
        {"limits": {"day": {"input": 50_000, "output": 2_000}}, "policy": {"window": 90_000}},
    )
    assert report["scope"] == f"key {key['id']}"
    assert report["limits"] == {
        "minute": {},
        "day": {"input": 50_000, "output": 2_000},
        "month": {},
    }
    assert report["policy"] == {"window": 90_000}
    report = await api.ok("PUT", path, {"limits": {"day": {"output": None}}})
    assert report["limits"]["day"] == {"input": 50_000}
    await api.ok("PUT", "/admin/budgets/team/web", {"limits": {"month": {"weighted": 10**6}}})

    async with client(proxy, key["key"]) as c:
        message = await c.messages.create(**REQUEST)
    spent = message.usage.input_tokens

    async def settled() -> bool:
        used = (await api.ok("GET", path))["used"]["day"]
        return bool(used["input"] == spent and used["output"] == message.usage.output_tokens)

    await until(settled)
    every = (await api.ok("GET", "/admin/budgets"))["budgets"]
    assert [b["scope"] for b in every] == [f"key {key['id']}", "team web"]
    assert every[1]["limits"]["month"] == {"weighted": 10**6}
    assert every[1]["used"]["month"]["weighted"] > 0

    for body, status, named in (
        ({"policy": {"trigger": 9_000, "target": 9_500}}, 400, "target"),
        ({"limits": {"week": {"input": 1}}}, 400, "week"),
        ({"limits": {"day": {"input": -5}}}, 400, "limits.day.input"),
        ({}, 400, "nothing to set"),
    ):
        got, answer = await api.call("PUT", path, body)
        assert got == status and named in answer["error"]["message"]
    assert (await api.call("GET", "/admin/budgets/key/0123456789ab"))[0] == 404
    assert (await api.call("GET", "/admin/budgets/tenant/x"))[0] == 400
    assert (await api.call("GET", "/admin/budgets/team/bad team"))[0] == 400


async def test_stats_count_what_the_conversation_did(
    make_standin: MakeStandIn, make_admin_proxy: MakeProxy, admin_key: str
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": 30_000}, max_recorded=None))
    proxy = await make_admin_proxy(standin.url)
    api = AdminAPI(proxy.url, admin_key)
    key = await new_key(api, team="infra")
    async with client(proxy, key["key"]) as c:
        turns = await run_agent(
            c, turns=24, result_chars=8_000, conversation=f"stats-{uuid.uuid4().hex}"
        )
    stats = await stats_when(api, lambda s: bool(s["last_hour"]["requests"] == len(turns)))
    for window in ("since_start", "last_hour", "last_day"):
        s = stats[window]
        assert s["requests"] == len(turns) and s["errors"] == 0
        assert s["by_route"] == {"/v1/messages": {"200": len(turns)}}
        # What the client saw, request by request (no read rounds: usage is per answer).
        usage = [t.message.usage.model_dump() for t in turns]
        for field in s["tokens"]:
            assert s["tokens"][field] == sum(u.get(field) or 0 for u in usage), field
        rewritten = [t.headers for t in turns if "x-compaction-strategy" in t.headers]
        crossings = [h for h in rewritten if h["x-compaction-strategy"] != "checkpoint"]
        before = sum(int(h["x-compaction-tokens-before"]) for h in rewritten)
        after = sum(int(h["x-compaction-tokens-after"]) for h in rewritten)
        assert s["history_tokens"] == {
            "rewritten_requests": len(rewritten),
            "before": before,
            "after": after,
            "saved": before - after,
        }
        assert s["crossings"] == len(crossings) >= 2
        assert s["summaries"]["made"] == sum(h["x-compaction-summary"] == "made" for h in rewritten)
        # The cost model, recomputed from what the client saw plus the summariser's calls.
        with_proxy = sum(CACHE_MODEL.cost(u) for u in usage)
        with_proxy += CACHE_MODEL.cost(s["summariser_tokens"])
        without = 0.0
        for t, u in zip(turns, usage, strict=True):
            removed = int(t.headers.get("x-compaction-tokens-before", 0)) - int(
                t.headers.get("x-compaction-tokens-after", 0)
            )
            cached = u.get("cache_read_input_tokens") or u.get("cache_creation_input_tokens")
            where = "cache_read_input_tokens" if cached else "input_tokens"
            without += CACHE_MODEL.cost({**u, where: (u.get(where) or 0) + removed})
        cost = s["cost"]["cache_model_units"]
        assert cost["with_proxy"] == pytest.approx(with_proxy, abs=1e-5)
        assert cost["without_proxy"] == pytest.approx(without, abs=1e-5)
        assert cost["saved"] == pytest.approx(without - with_proxy, abs=1e-5)
        assert s["by_team"]["infra"]["requests"] == len(turns)
        assert s["by_key"][key["id"]]["history_tokens_saved"] == before - after
        assert s["by_model"]["claude-test-1"]["cost"]["cache_model_units"] == cost
    # The same numbers /metrics has (one record feeds both).
    m = await scrape(proxy)
    s = stats["since_start"]
    assert s["history_tokens"]["saved"] == total(m, "compaction_proxy_tokens_saved_total")
    assert s["crossings"] == total(m, "compaction_proxy_compactions_total")
    assert s["tokens"]["cache_read_input_tokens"] == total(
        m, "compaction_proxy_cache_read_tokens_total"
    )
    # Recent events: the latest request of the conversation, and every crossing.
    latest = stats["recent"]["conversations"][0]
    last = turns[-1]
    assert latest["context_tokens_after"] == sum(
        last.message.usage.model_dump().get(f) or 0
        for f in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )
    assert latest["team"] == "infra" and latest["key"] == key["id"]
    assert len(stats["recent"]["crossings"]) == len(crossings)
    # Each says why, as the client was told (an offload step taken while the summary made
    # ahead was still being made says summary_pending: a race with the background call).
    said = {h.get("x-compaction-reason") or "history over the trigger" for h in crossings}
    assert {c["reason"] for c in stats["recent"]["crossings"]} == said
    assert "history over the trigger" in said
    assert stats["scope"]["since_start"] == "replica" and stats["scope"]["last_hour"] == "fleet"
    assert len(stats["minutes"]) == 60 and len(stats["hours"]) == 24
    assert sum(p["requests"] for p in stats["minutes"]) == len(turns)


async def test_refusals_and_errors_are_counted(
    standin: RunningStandIn, make_admin_proxy: MakeProxy, admin_key: str
) -> None:
    proxy = await make_admin_proxy(standin.url)
    api = AdminAPI(proxy.url, admin_key)
    key = await new_key(api, team="tiny")
    await api.ok("PUT", "/admin/budgets/team/tiny", {"limits": {"day": {"output": 10}}})
    async with client(proxy, key["key"]) as c:
        with pytest.raises(anthropic.RateLimitError):
            await c.messages.create(**REQUEST)
        with pytest.raises(anthropic.APIStatusError):
            await c.messages.create(
                **{**REQUEST, "max_tokens": 5}, extra_headers={"x-stand-in": '{"fault": "529"}'}
            )
    async with client(proxy, "cpk_0123456789ab_" + "A" * 43) as c:
        with pytest.raises(anthropic.AuthenticationError):
            await c.messages.create(**REQUEST)
    stats = await stats_when(api, lambda s: bool(s["last_hour"]["requests"] == 3))
    s = stats["last_hour"]
    assert s["budget_refusals"] == 1 and s["refusals"] == {
        "window": 0,
        "tokens": 1,
        "key": 1,
        "scope": 0,
        "store_unavailable": 0,
    }
    assert s["by_status"] == {"429": 1, "529": 1, "401": 1} and s["errors"] == 3
    kinds = [(e["status"], e["kind"]) for e in stats["recent"]["errors"]]
    assert kinds == [
        (401, "refused: invalid or missing key"),
        (529, "upstream error"),
        (429, "refused: over budget"),
    ]
    assert s["by_model"] == {}  # counted per model once the upstream accepted the model


async def test_stats_are_fleet_wide_across_replicas(
    standin: RunningStandIn, make_admin_proxy: MakeProxy, admin_key: str
) -> None:
    first = await make_admin_proxy(standin.url)
    second = await make_admin_proxy(standin.url)  # the same Redis and prefix
    api = AdminAPI(first.url, admin_key)
    key = await new_key(api)
    third = await make_admin_proxy(standin.url)
    for proxy, n in ((first, 3), (second, 2), (third, 1)):
        async with client(proxy, key["key"]) as c:
            for _ in range(n):
                await c.messages.create(**REQUEST)
    await third.stop()  # what it gathered is sent as it shuts down, not lost
    stats = await stats_when(api, lambda s: bool(s["last_hour"]["requests"] == 6))
    assert stats["since_start"]["requests"] == 3
    other = await AdminAPI(second.url, admin_key).ok("GET", "/admin/stats")
    assert other["since_start"]["requests"] == 2 and other["last_hour"]["requests"] == 6
    assert stats["last_day"]["by_key"][key["id"]]["requests"] == 6


async def test_stats_while_redis_is_away_then_back(
    standin: RunningStandIn,
    make_admin_proxy: MakeProxy,
    admin_key: str,
    embedded_redis: Callable[[], EmbeddedRedis],
) -> None:
    server = embedded_redis()
    # A key is trusted for auth.cache_seconds after its last check, outage or not.
    proxy = await make_admin_proxy(standin.url, redis=server.url, **{"auth.cache_seconds": 60.0})
    api = AdminAPI(proxy.url, admin_key)
    key = await new_key(api)
    async with client(proxy, key["key"]) as c:
        await c.messages.create(**REQUEST)
        server.stop_sync()
        await c.messages.create(**REQUEST)  # the key checked just before keeps working
        stats = await api.ok("GET", "/admin/stats")
        assert stats["fleet_error"] and stats["last_hour"] is None
        assert stats["since_start"]["requests"] == 2 and stats["scope"]["recent"] == "replica"
        assert stats["since_start"]["by_key"][key["id"]]["requests"] == 2
        server.start_sync()
        await c.messages.create(**REQUEST)
    # What was gathered while Redis was away was kept and sent when it came back.
    stats = await stats_when(
        api, lambda s: bool(s["last_hour"] and s["last_hour"]["requests"] == 3)
    )
    assert stats["last_day"]["requests"] == 3


async def test_stats_query_is_checked(
    standin: RunningStandIn, make_admin_proxy: MakeProxy, admin_key: str
) -> None:
    proxy = await make_admin_proxy(standin.url)
    api = AdminAPI(proxy.url, admin_key)
    stats = await api.ok("GET", "/admin/stats?minutes=5&hours=2")
    assert len(stats["minutes"]) == 5 and len(stats["hours"]) == 2
    for query in ("minutes=0", "hours=x", "minutes=100000"):
        status, body = await api.call("GET", f"/admin/stats?{query}")
        assert status == 400 and body["error"]["type"] == "invalid_request_error"


def test_the_admin_key_must_be_set_and_not_a_proxy_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = load_settings(None, environ={}, overrides={"auth.admin_key_env": ADMIN_KEY_ENV})
    for value, problem in (
        ("", "is not set"),
        ("short", "at least 16"),
        ("cpk_0123456789ab_" + "A" * 43, "must not be a proxy key"),
    ):
        with pytest.raises(ConfigError, match=problem):
            AdminKey.from_settings(settings, {ADMIN_KEY_ENV: value})
    with pytest.raises(ConfigError, match="environment variable name"):
        load_settings(None, environ={"COMPACTION_PROXY_AUTH_ADMIN_KEY_ENV": "not a name"})
    monkeypatch.delenv(ADMIN_KEY_ENV, raising=False)
    monkeypatch.setenv("COMPACTION_PROXY_AUTH_ADMIN_KEY_ENV", ADMIN_KEY_ENV)
    monkeypatch.chdir(tmp_path)
    code = main(["serve", "--port", "0", "--redis-url", "redis://127.0.0.1:1/0"])
    assert code == 2
    assert f"auth.admin_key_env: the admin key in ${ADMIN_KEY_ENV} is not set" in (
        capsys.readouterr().err
    )
