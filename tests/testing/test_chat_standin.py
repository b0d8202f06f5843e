"""The stand-in's Chat Completions route, through the real openai SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from proxy.testing.standin import StandInOptions
from tests.plugins.standin import RunningStandIn

MakeStandIn = Callable[[StandInOptions], Awaitable[RunningStandIn]]
READ_TOOL = {
    "type": "function",
    "function": {"name": "read_result", "parameters": {"type": "object", "properties": {}}},
}


@pytest.fixture
async def chat(standin: RunningStandIn) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=standin.url + "/v1", api_key="sk-chat", max_retries=0
    ) as client:
        yield client


def header(script: dict[str, Any]) -> dict[str, str]:
    return {"x-stand-in": orjson.dumps(script).decode()}


def call(i: str) -> dict[str, Any]:
    return {"id": i, "type": "function", "function": {"name": "Bash", "arguments": "{}"}}


async def test_pairing_rules_in_openai_wording(chat: openai.AsyncOpenAI) -> None:
    cases: list[tuple[list[dict[str, Any]], str]] = [
        (
            [
                {"role": "user", "content": "q"},
                {"role": "tool", "tool_call_id": "a", "content": "x"},
            ],
            "must be a response to a preceeding message with 'tool_calls'",
        ),
        (
            [
                {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")]},
                {"role": "tool", "tool_call_id": "a", "content": "x"},
                {"role": "user", "content": "next"},
            ],
            "The following tool_call_ids did not have response messages: b",
        ),
        (
            [
                {"role": "assistant", "content": None, "tool_calls": [call("a")]},
                {"role": "tool", "tool_call_id": "z", "content": "x"},
            ],
            "'tool_call_id' of 'z' not found in 'tool_calls' of previous message",
        ),
        ([{"role": "robot", "content": "x"}], "Invalid value: 'robot'"),
        ([], "empty array"),
    ]
    for messages, wording in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            await chat.chat.completions.create(model="gpt-test", messages=messages)  # type: ignore[arg-type]
        assert wording in caught.value.message
        assert caught.value.type == "invalid_request_error"
    ok = [
        {"role": "system", "content": "s"},
        {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")]},
        {"role": "tool", "tool_call_id": "b", "content": "x"},
        {"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": "y"}]},
        {"role": "user", "content": "next"},
    ]
    done = await chat.chat.completions.create(model="gpt-test", messages=ok)  # type: ignore[arg-type]
    assert done.choices[0].finish_reason == "stop"


async def test_the_window_and_cached_tokens(make_standin: MakeStandIn) -> None:
    standin = await make_standin(StandInOptions(windows={"gpt-small": 2_000}))
    async with openai.AsyncOpenAI(base_url=standin.url + "/v1", api_key="k", max_retries=0) as c:
        big = [{"role": "user", "content": "word " * 3_000}]
        with pytest.raises(openai.BadRequestError) as caught:
            await c.chat.completions.create(model="gpt-small", messages=big)  # type: ignore[arg-type]
        assert caught.value.code == "context_length_exceeded"
        assert "This model's maximum context length is 2000 tokens." in caught.value.message
        prompt = [{"role": "system", "content": "rules " * 1_500}, {"role": "user", "content": "a"}]
        first = await c.chat.completions.create(model="gpt-big", messages=prompt)  # type: ignore[arg-type]
        grown = [*prompt, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
        second = await c.chat.completions.create(model="gpt-big", messages=grown)  # type: ignore[arg-type]
    assert first.usage is not None and second.usage is not None
    assert first.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert 0 < second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens
    assert second.usage.total_tokens == second.usage.prompt_tokens + second.usage.completion_tokens


async def test_scripted_read_result_and_stream_framing(chat: openai.AsyncOpenAI) -> None:
    stub = 'head\n[... Call read_result(ref="r_0123456789abcdef", start=4, length=10) ...]'
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call("a")]},
        {"role": "tool", "tool_call_id": "a", "content": stub},
    ]
    stream = await chat.chat.completions.create(
        model="gpt-test",
        messages=messages,  # type: ignore[arg-type]
        tools=[READ_TOOL],  # type: ignore[list-item]
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=header({"read_result": True}),
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    fragments = [tc for c in chunks for ch in c.choices for tc in ch.delta.tool_calls or []]
    assert fragments[0].function is not None and fragments[0].function.name == "read_result"
    arguments = "".join(f.function.arguments or "" for f in fragments if f.function)
    assert orjson.loads(arguments)["ref"] == "r_0123456789abcdef"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


async def test_summaries_faults_and_credentials(standin: RunningStandIn) -> None:
    url = standin.url + "/v1/chat/completions"
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "src/app.py failed"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=body) as r:
            assert r.status == 401 and "Bearer" in (await r.json())["error"]["message"]
        auth = {"Authorization": "Bearer k"}
        purpose = {**auth, "x-compaction-proxy-purpose": "summary"}
        async with session.post(
            url, json={**body, "max_completion_tokens": 50}, headers=purpose
        ) as r:
            text = (await r.json())["choices"][0]["message"]["content"]
            assert "src/app.py" in text
        bad = {**body, "stream_options": {"include_usage": True}}
        async with session.post(url, json=bad, headers=auth) as r:
            assert r.status == 400 and (await r.json())["error"]["param"] == "stream_options"
        faulty = {**auth, **header({"fault": "529"})}
        async with session.post(url, json=body, headers=faulty) as r:
            assert r.status == 503 and (await r.json())["error"]["type"] == "server_error"
    async with openai.AsyncOpenAI(base_url=standin.url + "/v1", api_key="k", max_retries=0) as c:
        stream = await c.chat.completions.create(
            model="gpt-test",
            messages=body["messages"],  # type: ignore[arg-type]
            stream=True,
            extra_headers=header({"fault": "stream_error"}),
        )
        with pytest.raises(openai.APIError, match="overloaded"):
            async for _ in stream:
                pass
