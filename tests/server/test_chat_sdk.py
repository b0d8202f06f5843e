"""The openai SDK through the proxy: identical to going direct when nothing is rewritten.

Each comparison uses two stand-ins with the same options (one behind the proxy, one
direct), so their prompt caches see the same requests. Also: the proxy's own errors in
OpenAI's shape, upstream errors passed through, and which upstream other paths reach.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from proxy.server.app import start
from proxy.testing.agent import tool_output
from proxy.testing.standin import StandInOptions
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import MakeProxy, proxy_settings

MakeStandIn = Callable[[StandInOptions], Awaitable[RunningStandIn]]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "Bash", "parameters": {"type": "object", "properties": {}}},
    }
]
HISTORY: list[dict[str, Any]] = [
    {"role": "developer", "content": "Answer briefly."},
    {"role": "user", "content": [{"type": "text", "text": "What is in src/?"}]},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "app.py\nutil.py"},
]
SCRIPTS = [
    {"text": "Two files: app.py and util.py."},
    {"tool": {"name": "Bash", "input": {"command": "cat src/app.py"}}},
    {"text": "Reading it now.", "tool": {"name": "Bash", "input": {"command": "ls -la"}}},
]


def script_header(script: dict[str, Any]) -> dict[str, str]:
    return {"x-stand-in": orjson.dumps(script).decode()}


def request(script: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "gpt-test-1",
        "messages": HISTORY,
        "tools": TOOLS,
        "max_completion_tokens": 200,
        "extra_headers": script_header(script),
    }


async def pair(make_standin: MakeStandIn, make_proxy: MakeProxy) -> tuple[str, str]:
    """(direct base URL, proxied base URL), each with its own fresh stand-in."""
    direct = await make_standin(StandInOptions())
    behind = await make_standin(StandInOptions())
    proxy = await make_proxy(behind.url, **{"upstream.openai_url": behind.url})
    return direct.url + "/v1", proxy.url + "/v1"


@pytest.mark.parametrize("script", SCRIPTS, ids=["text", "tool", "text+tool"])
async def test_async_whole_and_stream_are_identical(
    make_standin: MakeStandIn, make_proxy: MakeProxy, script: dict[str, Any]
) -> None:
    results = []
    for base in await pair(make_standin, make_proxy):
        async with openai.AsyncOpenAI(base_url=base, api_key="sk-test", max_retries=0) as client:
            whole = await client.chat.completions.create(**request(script))
            stream = await client.chat.completions.create(
                **request(script), stream=True, stream_options={"include_usage": True}
            )
            chunks = [chunk.model_dump() async for chunk in stream]
            bare = await client.chat.completions.create(**request(script), stream=True)
            plain = [chunk.model_dump() async for chunk in bare]
        results.append((whole.model_dump(), chunks, plain))
    assert results[0] == results[1]
    whole, chunks, plain = results[1]
    assert chunks[-1]["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]
    assert all(c["usage"] is None for c in plain)


def test_sync_whole_and_stream_are_identical(
    make_standin_thread: Callable[[StandInOptions], RunningStandIn],
    make_proxy_thread: Callable[..., Any],
) -> None:
    direct = make_standin_thread(StandInOptions())
    behind = make_standin_thread(StandInOptions())
    proxy = make_proxy_thread(behind.url, **{"upstream.openai_url": behind.url})
    results = []
    for base in (direct.url, proxy.url):
        client = openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)
        for script in SCRIPTS:
            whole = client.chat.completions.create(**request(script))
            with client.chat.completions.stream(**request(script)) as stream:
                events = [event.type for event in stream]
                final = stream.get_final_completion()
            results.append((whole.model_dump(), events, final.model_dump()))
    assert results[: len(SCRIPTS)] == results[len(SCRIPTS) :]
    assert results[1][2]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "Bash"


async def test_upstream_errors_pass_through_unchanged(
    make_standin: MakeStandIn, make_proxy: MakeProxy
) -> None:
    orphan = [{"role": "tool", "tool_call_id": "nope", "content": "x"}]
    caught = []
    for base in await pair(make_standin, make_proxy):
        async with openai.AsyncOpenAI(base_url=base, api_key="sk-test", max_retries=0) as client:
            with pytest.raises(openai.BadRequestError) as bad:
                await client.chat.completions.create(model="gpt-test-1", messages=orphan)
            with pytest.raises(openai.RateLimitError) as limited:
                await client.chat.completions.create(
                    model="gpt-test-1",
                    messages=HISTORY,
                    extra_headers=script_header({"fault": "429", "retry_after_ms": 2000}),
                )
        caught.append((bad.value.body, limited.value.body, limited.value.response.headers))
    (bad_direct, limit_direct, h_direct), (bad_proxy, limit_proxy, h_proxy) = caught
    assert bad_proxy == bad_direct and "preceeding message with 'tool_calls'" in str(bad_proxy)
    assert limit_proxy == limit_direct
    assert h_proxy["retry-after"] == h_direct["retry-after"] == "2"


async def test_the_proxys_own_errors_are_in_openai_shape(
    make_standin: MakeStandIn, make_proxy: MakeProxy
) -> None:
    standin = await make_standin(StandInOptions())
    proxy = await make_proxy(
        standin.url, **{"upstream.openai_url": standin.url, "server.max_body_bytes": 2000}
    )
    url = proxy.url + "/v1/chat/completions"
    headers = {"Authorization": "Bearer sk-test", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as session:
        async with session.post(url, data=b"{not json", headers=headers) as r:
            assert r.status == 400
            error = (await r.json())["error"]
        async with session.post(url, data=b"x" * 5000, headers=headers) as r:
            assert r.status == 413
            too_large = (await r.json())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and "JSON" in error["message"]
    assert too_large["code"] == "request_too_large"
    assert standin.recorded == []

    # No upstream at all: 502 in OpenAI's shape, which the SDK treats as a server error.
    dead = await make_proxy(standin.url, **{"upstream.openai_url": "http://127.0.0.1:9"})
    async with openai.AsyncOpenAI(base_url=dead.url + "/v1", api_key="k", max_retries=0) as client:
        with pytest.raises(openai.InternalServerError) as failed:
            await client.chat.completions.create(model="gpt-test-1", messages=HISTORY)
    assert failed.value.status_code == 502
    assert failed.value.type == "server_error" and "could not reach" in failed.value.message


async def test_other_paths_reach_the_upstream_the_rule_picks(
    make_standin: MakeStandIn, make_proxy: MakeProxy
) -> None:
    anthropic_side = await make_standin(StandInOptions())
    openai_side = await make_standin(StandInOptions())
    proxy = await make_proxy(anthropic_side.url, **{"upstream.openai_url": openai_side.url})
    async with openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0) as client:
        with pytest.raises(openai.NotFoundError):  # the stand-in has no embeddings API
            await client.embeddings.create(model="emb-test", input="hello")
        # A path both APIs have: a Bearer client without anthropic-version is an OpenAI
        # client. (The stand-in's models route is Anthropic's, so it asks for that header.)
        with pytest.raises(openai.BadRequestError, match="anthropic-version"):
            await client.models.list()
    anthropic_headers = {"x-api-key": "sk-test", "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession() as session:
        async with session.get(proxy.url + "/v1/models", headers=anthropic_headers) as r:
            assert r.status == 200
        async with session.get(proxy.url + "/v1/unknown", headers=anthropic_headers) as r:
            await r.read()
    assert [r.path_qs for r in openai_side.recorded] == ["/v1/embeddings", "/v1/models"]
    assert [r.path_qs for r in anthropic_side.recorded] == ["/v1/models", "/v1/unknown"]


async def test_offload_stays_off_for_several_choices(
    make_standin: MakeStandIn, redis_url: str, redis_key_prefix: str
) -> None:
    """With n > 1 the read_result rounds could follow only one choice: no read_result is
    injected, so no choice can call a tool the client does not have."""
    standin = await make_standin(StandInOptions(windows={"*": 30_000}))
    settings = proxy_settings(
        standin.url,
        redis_url,
        **{"upstream.openai_url": standin.url, "store.key_prefix": redis_key_prefix},
    )
    policy = {"match": "*", "window": 30_000, "trigger": 6_000, "target": 5_000}
    policy.update(offload_threshold=500, keep_results=1)
    running = await start(dataclasses.replace(settings, policies=(policy,)))
    stack = contextlib.AsyncExitStack()
    try:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
        for t in range(8):
            call = {"id": f"c{t}", "type": "function"}
            call["function"] = {"name": "Bash", "arguments": "{}"}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            messages.append(
                {"role": "tool", "tool_call_id": f"c{t}", "content": tool_output(t, 4000)}
            )
        client = openai.AsyncOpenAI(base_url=running.url + "/v1", api_key="sk-n", max_retries=0)
        await stack.enter_async_context(client)
        for n in (1, 2):  # n=2 must not reuse the stubs n=1 checkpointed
            raw = await client.chat.completions.with_raw_response.create(
                model="gpt-test-1", messages=messages, tools=TOOLS, n=n
            )
            completion = raw.parse()
            assert len(completion.choices) == n
            sent = orjson.loads(standin.recorded[-1].body)
            names = [t["function"]["name"] for t in sent["tools"]]
            if n == 2:
                assert names == ["Bash"]
                assert raw.headers["x-compaction-strategy"] in ("summary", "pack")
            else:
                assert names == ["Bash", "read_result"]
                assert raw.headers["x-compaction-strategy"].startswith("offload")
    finally:
        await stack.aclose()
        await running.stop()
