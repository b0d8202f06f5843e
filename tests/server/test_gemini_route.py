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

from proxy.testing.standin import StandInOptions
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import MakeProxy

MakeStandIn = Callable[[StandInOptions], Awaitable[RunningStandIn]]
FLASH = "gemini-2.5-flash"
GEMINI_3 = "gemini-3-flash-preview"
SHELL = types.FunctionDeclaration(
    name="run_shell_command",
    description="Runs a shell command.",
    parameters_json_schema={
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
)
CALL = {"name": "run_shell_command", "input": {"command": "ls src"}}


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
