"""The Gemini API through the proxy with google-genai, unmodified: answers whole and
streamed, function calls with their signatures, countTokens and the model listing
passed through, a key given in the query, and the proxy's own errors in Google's shape."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from google import genai
from google.genai import errors, types

from proxy.store import Store
from proxy.store.accounts import Accounts
from proxy.testing.agent_loop import tool_output
from proxy.testing.standin import StandInOptions
from tests.gemini_agent import DECLARATION
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import SMALL_WINDOW, MakeProxy

MakeStandIn = Callable[[StandInOptions], Awaitable[RunningStandIn]]
FLASH = "gemini-2.5-flash"
GEMINI_3 = "gemini-3-flash-preview"
SHELL = DECLARATION  # run_shell_command, as Gemini CLI declares it
CALL = {"name": "run_shell_command", "input": {"command": "ls src"}}
PURPOSE = "x-compaction-proxy-purpose"


def client_for(url: str, **headers: str) -> genai.Client:
    options = types.HttpOptions(
        base_url=url, headers=headers, retry_options=types.HttpRetryOptions(attempts=1)
    )
    return genai.Client(api_key="gemini-test-key", http_options=options)


async def pair(make_standin: MakeStandIn, make_proxy: MakeProxy) -> tuple[str, str, Any]:
    """(direct URL, proxied URL, the stand-in behind the proxy)."""
    direct = await make_standin(StandInOptions())
    behind = await make_standin(StandInOptions())
    proxy = await make_proxy("http://127.0.0.1:9", **{"upstream.gemini_url": behind.url})
    return direct.url, proxy.url, behind


def _plain(response: types.GenerateContentResponse) -> dict[str, Any]:
    dumped = response.model_dump(mode="json", exclude_none=True)
    dumped.pop("sdk_http_response", None)
    return dumped


@pytest.mark.parametrize("script", [{}, {"tool": CALL}], ids=["text", "call"])
async def test_answers_are_the_upstreams_whole_and_streamed(
    make_standin: MakeStandIn, make_proxy: MakeProxy, script: dict[str, Any]
) -> None:
    config = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[SHELL])])
    seen = []
    for url in (await pair(make_standin, make_proxy))[:2]:
        client = client_for(url, **{"x-stand-in": json.dumps(script)})
        whole = await client.aio.models.generate_content(
            model=GEMINI_3, contents="What is in src/?", config=config
        )
        streamed = [
            _plain(c)
            async for c in await client.aio.models.generate_content_stream(
                model=GEMINI_3, contents="What is in src/?", config=config
            )
        ]
        seen.append((_plain(whole), streamed))
    assert seen[0] == seen[1]
    whole, streamed = seen[0]
    if script:
        part = whole["candidates"][0]["content"]["parts"][0]
        assert part["function_call"]["name"] == "run_shell_command" and part["thought_signature"]
    assert streamed[-1]["candidates"][0]["finish_reason"] == "STOP"


async def test_count_tokens_listing_and_a_key_in_the_query(
    make_standin: MakeStandIn, make_proxy: MakeProxy
) -> None:
    _, url, behind = await pair(make_standin, make_proxy)
    client = client_for(url)
    counted = await client.aio.models.count_tokens(model=FLASH, contents="What is in src/?")
    answer = await client.aio.models.generate_content(model=FLASH, contents="What is in src/?")
    assert answer.usage_metadata is not None
    assert counted.total_tokens == answer.usage_metadata.prompt_token_count
    names = [m.name async for m in await client.aio.models.list(config={"page_size": 5})]
    assert "models/gemini-3.5-flash-lite" in names
    body = {"contents": [{"role": "user", "parts": [{"text": "hello"}]}]}
    async with aiohttp.ClientSession() as session:
        target = f"{url}/v1beta/models/{FLASH}:generateContent?key=in-the-query"
        async with session.post(target, json=body) as response:
            assert response.status == 200
            assert (await response.json())["candidates"][0]["finishReason"] == "STOP"
    recorded = behind.recorded[-1]
    assert recorded.path_qs == f"/v1beta/models/{FLASH}:generateContent"
    assert recorded.headers["x-goog-api-key"] == "in-the-query"
    assert [r.headers.get("x-goog-api-key") for r in behind.recorded[:-1]] == [
        "gemini-test-key"
    ] * (len(behind.recorded) - 1)


async def test_the_proxys_own_errors_are_in_googles_shape(
    make_standin: MakeStandIn, make_proxy: MakeProxy
) -> None:
    _, url, behind = await pair(make_standin, make_proxy)
    async with aiohttp.ClientSession() as session:
        target = f"{url}/v1beta/models/{FLASH}:generateContent"
        headers = {"x-goog-api-key": "k", "content-type": "application/json"}
        async with session.post(target, data=b"{not json", headers=headers) as response:
            error = (await response.json())["error"]
    assert response.status == 400 and error["status"] == "INVALID_ARGUMENT"
    assert error["code"] == 400 and error["message"].startswith("Invalid JSON payload received.")
    assert behind.recorded == []
    client = client_for(url, **{"x-stand-in": json.dumps({"fault": "429"})})
    with pytest.raises(errors.ClientError) as limited:
        await client.aio.models.generate_content(model=FLASH, contents="hi")
    assert limited.value.code == 429 and limited.value.status == "RESOURCE_EXHAUSTED"


async def test_a_proxy_key_for_gemini_goes_upstream_as_its_mapped_key(
    monkeypatch: pytest.MonkeyPatch, make_standin: MakeStandIn, make_proxy: MakeProxy, store: Store
) -> None:
    monkeypatch.setenv("CP_TEST_GEMINI_KEY", "upstream-gemini-secret")
    behind = await make_standin(StandInOptions())
    proxy = await make_proxy(
        "http://127.0.0.1:9",
        **{
            "auth.keys": "required",
            "auth.cache_seconds": 0.0,
            "store.key_prefix": store.prefix,
            "upstream.gemini_url": behind.url,
        },
    )
    accounts = Accounts(store)
    gemini_key, _ = await accounts.create_key(
        team="t", upstream_env="CP_TEST_GEMINI_KEY", upstream_scheme="x-goog-api-key",
        provider="gemini", scopes=("models",),
    )  # fmt: skip
    anthropic_key, _ = await accounts.create_key(
        team="t", upstream_env="CP_TEST_GEMINI_KEY", upstream_scheme="x-api-key",
        provider="anthropic",
    )  # fmt: skip
    options = types.HttpOptions(
        base_url=proxy.url, retry_options=types.HttpRetryOptions(attempts=1)
    )
    client = genai.Client(api_key=gemini_key, http_options=options)
    answer = await client.aio.models.generate_content(model=FLASH, contents="hello")
    assert answer.text
    names = [m.name async for m in await client.aio.models.list()]
    assert f"models/{FLASH}" in names
    assert [r.headers.get("x-goog-api-key") for r in behind.recorded] == [
        "upstream-gemini-secret"
    ] * len(behind.recorded)
    assert not any(gemini_key in str(r.headers) for r in behind.recorded)
    other = genai.Client(api_key=anthropic_key, http_options=options)
    with pytest.raises(errors.ClientError) as refused:
        await other.aio.models.generate_content(model=FLASH, contents="hello")
    assert refused.value.code == 403 and refused.value.status == "PERMISSION_DENIED"
    assert "part of the Gemini API" in str(refused.value.message)


def long_history(turns: int) -> list[dict[str, Any]]:
    """A task, then `turns` shell calls each answered with an 8,000-character log."""
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": "Build it."}]}]
    for turn in range(turns):
        call = {"functionCall": {"name": "run_shell_command", "args": {"command": f"make {turn}"}}}
        contents.append({"role": "model", "parts": [call]})
        output = {"name": "run_shell_command", "response": {"output": tool_output(turn, 8_000)}}
        contents.append({"role": "user", "parts": [{"functionResponse": output}]})
    return contents


async def test_count_tokens_counts_what_the_model_would_be_sent(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy
) -> None:
    behind = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}))
    proxy = await make_compacting_proxy("http://127.0.0.1:9", **{"upstream.gemini_url": behind.url})
    direct, proxied = client_for(behind.url), client_for(proxy.url)
    contents = [types.Content.model_validate(c) for c in long_history(12)]
    as_sent = await direct.aio.models.count_tokens(model=FLASH, contents=contents)
    counted = await proxied.aio.models.count_tokens(model=FLASH, contents=contents)
    assert as_sent.total_tokens is not None and as_sent.total_tokens > SMALL_WINDOW
    assert counted.total_tokens is not None and counted.total_tokens <= SMALL_WINDOW
    upstream = json.loads(behind.recorded[-1].body)["generateContentRequest"]
    assert upstream["model"] == f"models/{FLASH}"
    assert "read_result" in json.dumps(upstream["tools"])  # its stubs name it
    assert len(upstream["contents"]) <= len(contents)
    # What the model then sees of that history: no more than counted (a fold's summary is
    # counted at its cap).
    sent = await proxied.aio.models.generate_content(model=FLASH, contents=contents)
    assert sent.usage_metadata is not None and sent.usage_metadata.prompt_token_count
    assert sent.usage_metadata.prompt_token_count <= counted.total_tokens
    short = [types.Content.model_validate(c) for c in long_history(1)]
    assert (await proxied.aio.models.count_tokens(model=FLASH, contents=short)).total_tokens == (
        await direct.aio.models.count_tokens(model=FLASH, contents=short)
    ).total_tokens
    assert behind.recorded[-2].body == behind.recorded[-1].body  # the client's bytes
    assert [r.headers.get(PURPOSE) for r in behind.recorded] == [None] * len(behind.recorded)


async def test_the_json_array_form_is_relayed_and_never_given_read_result(
    make_standin: MakeStandIn, make_compacting_proxy: MakeProxy
) -> None:
    behind = await make_standin(StandInOptions(windows={"*": SMALL_WINDOW}))
    proxy = await make_compacting_proxy("http://127.0.0.1:9", **{"upstream.gemini_url": behind.url})
    contents = long_history(12)
    body = {"contents": contents, "tools": [{"functionDeclarations": [SHELL.model_dump(
        mode="json", by_alias=True, exclude_none=True)]}]}  # fmt: skip
    headers = {"x-goog-api-key": "k", "x-stand-in": json.dumps({"read_result": True})}
    async with aiohttp.ClientSession() as session:
        target = f"{proxy.url}/v1beta/models/{FLASH}:streamGenerateContent"
        async with session.post(target, json=body, headers=headers) as response:
            raw = await response.read()
            strategy = response.headers.get("x-compaction-strategy", "")
    assert response.status == 200 and raw.startswith(b"[{") and raw.endswith(b"}]")
    chunks = json.loads(raw)
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    assert strategy and "offload" not in strategy  # folded or packed, never offloaded
    (sent,) = [json.loads(r.body) for r in behind.recorded if not r.headers.get(PURPOSE)]
    assert b"read_result" not in json.dumps(sent).encode()
    assert len(sent["contents"]) < len(contents)
