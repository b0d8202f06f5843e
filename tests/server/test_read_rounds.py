"""read_result rounds as a client sees them: every round fits the window, the answer is
always a valid, non-empty message, and its usage is what the model saw last.

A history of large tool results crosses the trigger and is offloaded; then the stand-in
is scripted to keep calling read_result for every stub it has not read (the model that
reads past the limit) with slices as large as the tool allows (reads that would overflow
the window). Both APIs, stream and not, through the real SDKs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import anthropic
import openai
import orjson
import pytest

from proxy.server.app import RunningProxy, start
from proxy.testing.agent import tool_output
from proxy.testing.standin import StandInOptions
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import proxy_settings

WINDOW = 12_000
POLICY: dict[str, Any] = {
    "match": "*",
    "window": WINDOW,
    "trigger": 8_000,
    "target": 5_000,
    "keep_last": 2,
    "keep_results": 1,
    "offload_threshold": 300,
    "stub_head_chars": 200,
    "max_read_rounds": 3,
}
RESULTS = 8
RESULT_CHARS = 8_000  # about 3,150 tokens each: three whole slices would not fit
READ_EVERYTHING = orjson.dumps(
    {"read_result": True, "keep_reading": True, "read_length": 32_000}
).decode()
PURPOSE = "x-compaction-proxy-purpose"


def anthropic_history() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Find the failing test."}]
    for n in range(RESULTS):
        call = {"type": "tool_use", "id": f"toolu_{n:03d}", "name": "Bash", "input": {"n": n}}
        messages.append({"role": "assistant", "content": [call]})
        result = {"type": "tool_result", "tool_use_id": call["id"]}
        messages.append(
            {"role": "user", "content": [{**result, "content": tool_output(n, RESULT_CHARS)}]}
        )
    messages.append({"role": "assistant", "content": "Those were the logs."})
    messages.append({"role": "user", "content": "Which test fails? Read the logs again."})
    return messages


def chat_history() -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Find the failing test."}]
    for n in range(RESULTS):
        call = {
            "id": f"call_{n:03d}",
            "type": "function",
            "function": {"name": "Bash", "arguments": "{}"},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append(
            {"role": "tool", "tool_call_id": call["id"], "content": tool_output(n, RESULT_CHARS)}
        )
    messages.append({"role": "assistant", "content": "Those were the logs."})
    messages.append({"role": "user", "content": "Which test fails? Read the logs again."})
    return messages


TOOLS = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}]


async def compacting(standin: RunningStandIn, redis_url: str, prefix: str) -> RunningProxy:
    overrides = {"store.key_prefix": prefix, "upstream.openai_url": standin.url}
    settings = proxy_settings(standin.url, redis_url, **overrides)
    return await start(dataclasses.replace(settings, policies=(POLICY,)))


def upstream_calls(standin: RunningStandIn) -> list[Any]:
    return [
        r
        for r in standin.recorded
        if r.path_qs.split("?")[0] in ("/v1/messages", "/v1/chat/completions")
        and not r.headers.get(PURPOSE)
    ]


def assert_every_round_fit(standin: RunningStandIn) -> list[Any]:
    calls = upstream_calls(standin)
    assert len(calls) >= 2, "the model read"
    assert all(r.status == 200 for r in calls), [(r.status, r.error) for r in calls]
    shortened = [r for r in calls if b"Shortened to fit the context window" in r.body]
    sizes = [sum(v for k, v in r.usage.items() if k.endswith("tokens") and "output" not in k)
             for r in calls]  # fmt: skip
    assert shortened, sizes
    return calls


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_anthropic_rounds_fit_and_end_in_a_valid_message(
    make_standin: Any, redis_url: str, redis_key_prefix: str, stream: bool
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": WINDOW}))
    proxy = await compacting(standin, redis_url, redis_key_prefix)
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-rounds", max_retries=0)
    request = {
        "model": "claude-test",
        "max_tokens": 300,
        "tools": TOOLS,
        "messages": anthropic_history(),
        "extra_headers": {"x-stand-in": READ_EVERYTHING},
    }
    if stream:
        async with client.messages.stream(**request) as s:
            message = await s.get_final_message()
    else:
        message = await client.messages.create(**request)
    await client.close()

    calls = assert_every_round_fit(standin)
    assert len(calls) == 1 + POLICY["max_read_rounds"], message
    texts = [b.text for b in message.content if b.type == "text"]
    assert texts and texts[-1].startswith("[compaction-proxy: still reading")
    assert all(b.type != "tool_use" for b in message.content)
    assert message.stop_reason == "end_turn"
    # The last round's input (a stream may move a token between its fields so that every
    # way of merging message_start and message_delta gives that total).
    last = calls[-1].usage
    assert abs(message.usage.input_tokens - last["input_tokens"]) <= 2
    told = (
        message.usage.input_tokens
        + (message.usage.cache_read_input_tokens or 0)
        + (message.usage.cache_creation_input_tokens or 0)
    )
    fields = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    assert told == sum(last[f] for f in fields) <= WINDOW


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_chat_rounds_fit_and_end_in_a_valid_message(
    make_standin: Any, redis_url: str, redis_key_prefix: str, stream: bool
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": WINDOW}))
    proxy = await compacting(standin, redis_url, redis_key_prefix)
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-rounds", max_retries=0)
    request: dict[str, Any] = {
        "model": "gpt-test",
        "max_completion_tokens": 300,
        "tools": CHAT_TOOLS,
        "messages": chat_history(),
        "extra_headers": {"x-stand-in": READ_EVERYTHING},
    }
    if stream:
        chunks = await client.chat.completions.create(
            **request, stream=True, stream_options={"include_usage": True}
        )
        text, usage, finish = "", None, None
        async for chunk in chunks:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                assert not choice.delta.tool_calls
                finish = choice.finish_reason or finish
    else:
        completion = await client.chat.completions.create(**request)
        choice = completion.choices[0]
        text, usage, finish = choice.message.content or "", completion.usage, choice.finish_reason
        assert not choice.message.tool_calls
    await client.close()

    calls = assert_every_round_fit(standin)
    assert len(calls) == 1 + POLICY["max_read_rounds"]
    assert text.rstrip().endswith("ask to continue if more is needed.]")
    assert finish == "stop"
    assert usage is not None
    last = calls[-1].usage
    assert usage.prompt_tokens == last["prompt_tokens"] <= WINDOW
