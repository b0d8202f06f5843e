"""What one client can do to the proxy's shared state, through one proxy on a loopback port:
model names are bounded and never stored, calibration is per tenant (and not fed by
requests whose count is a flat guess), an upstream that answers garbage gets a 502, and
with keys required there is no OpenAI upstream until one is configured."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest
import redis.asyncio
from aiohttp import web

from proxy.core.identity import tenant_of
from proxy.core.model_names import MAX_CHARS
from proxy.core.tokens import default_counter
from proxy.server.app import RunningProxy
from proxy.server.calibration import CALIBRATION_SAMPLES, Calibration, store_name
from proxy.server.compactor import calibrated_as
from proxy.store import Store
from proxy.store.accounts import Accounts
from proxy.store.keys import scan_pattern
from proxy.wire import ANTHROPIC
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import MakeProxy
from tests.server.test_budget_read_rounds import tool_history
from tests.server.test_keys_and_budgets import ENV, UPSTREAM_SECRET

COUNTER = default_counter()
TOOLS = [{"name": "Bash", "description": "Run a command.", "input_schema": {"type": "object"}}]


# -- model names ---------------------------------------------------------------------------


async def test_model_names_are_bounded_and_never_part_of_a_key_name(
    standin: RunningStandIn, make_proxy: MakeProxy, redis_url: str, redis_key_prefix: str
) -> None:
    """150 unique 1 MiB model names grew the replica from 153 to 313 MB and left a 7-day
    Redis key holding each name (finding 10)."""
    proxy = await make_proxy(
        standin.url, **{"store.key_prefix": redis_key_prefix, "upstream.openai_url": standin.url}
    )
    huge = "m" * (1 << 20)
    async with anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-m", max_retries=0) as c:
        for model in (huge, "x" * (MAX_CHARS + 1), "claude haiku", "claude\u00e9"):
            with pytest.raises(anthropic.BadRequestError) as refused:
                await c.messages.create(
                    model=model, max_tokens=8, messages=[{"role": "user", "content": "hi"}]
                )
            assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
            assert "model:" in refused.value.message
    async with openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-m", max_retries=0) as o:
        with pytest.raises(openai.BadRequestError) as refused_chat:
            await o.chat.completions.create(
                model=huge, messages=[{"role": "user", "content": "hi"}]
            )
    assert refused_chat.value.body["param"] == "model"  # type: ignore[index]
    assert not standin.recorded  # nothing of them went upstream
    # A long but valid name is served, calibrated, and stored only as a digest.
    model = "claude-" + uuid.uuid4().hex * 7  # 231 characters
    async with anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-m", max_retries=0) as c:
        for _ in range(3):
            await c.messages.create(
                model=model, max_tokens=8, messages=[{"role": "user", "content": "hi " * 50}]
            )
    await asyncio.sleep(0.3)  # calibration samples are written in the background
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        names = [k async for k in client.scan_iter(match=scan_pattern(redis_key_prefix))]
    finally:
        await client.aclose()
    assert names, "calibration stored nothing"
    assert all(model.encode() not in name and len(name) < 200 for name in names)


def test_a_replica_keeps_a_bounded_number_of_calibration_factors() -> None:
    calibration = Calibration(entries=100)
    for n in range(1_000):
        calibration.factor(f"model-{n}", None, f"t{n % 7}")
        calibration.wants_sample(f"model-{n}", f"t{n % 7}")
    assert len(calibration) == 100
    calibration.factor("model-999", None, "t5")  # the newest are kept
    assert len(calibration) == 100


# -- calibration per tenant ------------------------------------------------------------------


def _message(body: dict[str, Any], input_tokens: int) -> dict[str, Any]:
    return {
        "id": f"msg_{uuid.uuid4().hex[:20]}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model"),
        "content": [{"type": "text", "text": "Noted: the build is green."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 8},
    }


async def _skewed_messages(request: web.Request) -> web.Response:
    """Reports the project's own count of the request, times `x-test-scale`: a tenant
    whose requests the real tokenizer counts very differently (or whose documents cost far
    less than the flat guess)."""
    body = orjson.loads(await request.read())
    scale = float(request.headers.get("x-test-scale", "1"))
    reported = max(1, math.floor(COUNTER.count_request(body) * scale))
    return web.json_response(_message(body, reported))


@pytest.fixture
async def skewed_upstream() -> AsyncIterator[str]:
    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/messages", _skewed_messages)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    yield f"http://{host}:{port}"
    await runner.cleanup()


def _history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for n in range(turns):
        messages.append({"role": "user", "content": f"Step {n}: " + f"requirement r{n} " * 200})
        messages.append({"role": "assistant", "content": f"Done {n}: " + f"change c{n} " * 200})
    messages.append({"role": "user", "content": "What is left?"})
    return messages


async def _tokens_before(proxy: RunningProxy, key: str, model: str, history: Any) -> int:
    async with anthropic.AsyncAnthropic(base_url=proxy.url, api_key=key, max_retries=0) as c:
        raw = await c.messages.with_raw_response.create(
            model=model,
            max_tokens=16,
            messages=history,
            extra_headers={"x-conversation-id": f"cal-{uuid.uuid4().hex}"},
        )
    return int(raw.headers["x-compaction-tokens-before"])


async def _feed(proxy: RunningProxy, key: str, model: str, content: Any, scale: float) -> None:
    async with anthropic.AsyncAnthropic(base_url=proxy.url, api_key=key, max_retries=0) as c:
        for n in range(CALIBRATION_SAMPLES + 4):
            turn = {"role": "user", "content": [*content, {"type": "text", "text": f"#{n}"}]}
            await c.messages.create(
                model=model,
                max_tokens=16,
                messages=[turn],
                extra_headers={"x-test-scale": str(scale)},
            )


async def _samples(store: Store, model: str, key: str) -> int:
    for _ in range(100):
        name = store_name(calibrated_as(ANTHROPIC, model), tenant_of({"x-api-key": key}))
        found = await store.get_global_mean("calibration", name)
        if found is not None and found[1] >= CALIBRATION_SAMPLES:
            return found[1]
        await asyncio.sleep(0.05)
    return 0 if found is None else found[1]


async def test_one_tenant_cannot_skew_another_tenants_compaction(
    skewed_upstream: str, make_compacting_proxy: MakeProxy, store: Store
) -> None:
    """60 requests of one tenant with URL documents (estimated 15,000, reported 1,500)
    moved the fleet-wide factor from 1.0 to 0.61, and another tenant's 270,845-token
    history was then counted as 165,978 (finding 11)."""
    proxy = await make_compacting_proxy(skewed_upstream)
    model = f"claude-cal-{uuid.uuid4().hex[:8]}"
    history = _history(40)  # about 65,000 tokens: over the trigger (20,000) even at half
    text = [{"type": "text", "text": "Summarise the attached notes. " * 40}]
    document = [{"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}]
    # Tenant A's text really is counted at a tenth of our estimate (an extreme tokenizer);
    # tenant D's requests carry a document the counter can only guess at.
    await _feed(proxy, "sk-tenant-a", model, text, 0.1)
    await _feed(proxy, "sk-tenant-d", model, [*document, *text], 0.1)
    assert await _samples(store, model, "sk-tenant-a") >= CALIBRATION_SAMPLES
    await asyncio.sleep(0.3)  # D's would have been written by now, were there any
    name_d = store_name(calibrated_as(ANTHROPIC, model), tenant_of({"x-api-key": "sk-tenant-d"}))
    assert await store.get_global_mean("calibration", name_d) is None
    seen_a = await _tokens_before(proxy, "sk-tenant-a", model, history)
    seen_b = await _tokens_before(proxy, "sk-tenant-b", model, history)
    seen_d = await _tokens_before(proxy, "sk-tenant-d", model, history)
    fresh = await _tokens_before(proxy, "sk-tenant-c", model, history)
    assert seen_a < 0.6 * fresh  # A's own factor learnt its tokenizer
    assert seen_b == fresh  # B's counts are its own
    assert seen_d == fresh  # documents' flat guesses taught D's factor nothing


# -- garbage from the upstream ---------------------------------------------------------------


async def _garbage(request: web.Request) -> web.StreamResponse:
    await request.read()
    if request.headers.get("x-test-stream"):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        start = {"type": "message_start", "message": {"id": "msg_x", "usage": {"input_tokens": 5}}}
        await response.write(b"event: message_start\ndata: " + orjson.dumps(start) + b"\n\n")
        broken = b'{"index": "x", "content_block": 7}'  # not a block this API sends
        await response.write(b"event: content_block_start\ndata: " + broken + b"\n\n")
        await response.write_eof()
        return response
    return web.Response(body=b'{"type": "message", "content": [', content_type="application/json")


async def test_garbage_from_the_upstream_is_a_502_not_a_500(
    make_compacting_proxy: MakeProxy,
) -> None:
    """orjson errors on upstream JSON in read_result rounds were unguarded: garbage became
    a 500 or a cut stream instead of a 502 (a Low item). A request whose results were
    offloaded is answered by the proxy's own rounds, which read the answer."""
    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/messages", _garbage)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        proxy = await make_compacting_proxy(f"http://{host}:{port}")
        body = {"model": "claude-x", "max_tokens": 64, "messages": tool_history(12), "tools": TOOLS}
        headers = {"x-api-key": "sk-garbage", "anthropic-version": "2023-06-01"}
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{proxy.url}/v1/messages", json=body, headers=headers) as r:
                answer = await r.json()
                assert r.status == 502 and r.headers["x-should-retry"] == "true"
            assert answer["error"]["type"] == "api_error"
            assert "could not read the upstream's answer" in answer["error"]["message"]
            streamed = {**body, "stream": True}
            headers = {**headers, "x-test-stream": "1"}
            url = f"{proxy.url}/v1/messages"
            async with session.post(url, json=streamed, headers=headers) as r:
                assert r.status == 200
                events = (await r.read()).decode()
        assert "event: error" in events and "could not read the upstream's answer" in events
    finally:
        await runner.cleanup()


# -- no silent OpenAI default under keys ------------------------------------------------------


async def test_with_keys_required_there_is_no_openai_upstream_until_one_is_set(
    monkeypatch: pytest.MonkeyPatch, standin: RunningStandIn, make_proxy: MakeProxy, store: Store
) -> None:
    """upstream.openai_url defaulted to api.openai.com for a key store that never
    configured it (finding 6): an unset one now refuses OpenAI-format requests."""
    monkeypatch.setenv(ENV, UPSTREAM_SECRET)
    proxy = await make_proxy(
        standin.url, **{"auth.keys": "required", "store.key_prefix": store.prefix}
    )
    text, _ = await Accounts(store).create_key(
        team="t", upstream_env=ENV, upstream_scheme="bearer", provider="openai"
    )
    async with openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key=text, max_retries=0) as c:
        with pytest.raises(openai.PermissionDeniedError) as refused:
            await c.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
            )
    assert "upstream.openai_url is not set" in refused.value.message
    assert not standin.recorded
