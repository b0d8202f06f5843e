"""The anthropic SDK gets the same results through the proxy as directly from the upstream."""

from __future__ import annotations

from typing import Any

import anthropic

from tests.plugins.standin import RunningStandIn
from tests.server.conftest import MakeProxy

REQUEST: dict[str, Any] = {
    "model": "claude-haiku-4-5",
    "max_tokens": 256,
    "system": [{"type": "text", "text": "You are terse."}],
    "messages": [
        {"role": "user", "content": "List the files."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"p": "."}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py\nb.py"},
                {"type": "text", "text": "Now summarise them, please."},
            ],
        },
    ],
    "tools": [{"name": "ls", "description": "list", "input_schema": {"type": "object"}}],
}
TOOL_SCRIPT = '{"tool": {"name": "ls", "input": {"p": "src", "deep": true}}}'


def dumped(events: Any) -> list[dict[str, Any]]:
    return [event.model_dump() for event in events]


async def test_async_sdk_same_answers(standin: RunningStandIn, make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(standin.url)
    results = []
    for base in (standin.url, proxy.url):
        async with anthropic.AsyncAnthropic(base_url=base, api_key="sk-test") as client:
            message = await client.messages.create(**REQUEST)
            beta = await client.beta.messages.create(**REQUEST, betas=["context-1m-2025-08-07"])
            tool = await client.messages.create(
                **REQUEST, extra_headers={"x-stand-in": TOOL_SCRIPT}
            )
            raw = await client.messages.create(**REQUEST, stream=True)
            events = dumped([event async for event in raw])
            async with client.messages.stream(**REQUEST) as stream:
                texts = [text async for text in stream.text_stream]
                final = await stream.get_final_message()
            count = await client.messages.count_tokens(
                model=REQUEST["model"], messages=REQUEST["messages"]
            )
            models = [m.id async for m in client.models.list()]
            results.append(
                (
                    message.model_dump(),
                    beta.model_dump(),
                    tool.model_dump(),
                    events,
                    texts,
                    final.model_dump(),
                    count.input_tokens,
                    models,
                )
            )
    direct, proxied = results
    assert proxied == direct
    assert direct[2]["stop_reason"] == "tool_use"
    assert [e["type"] for e in direct[3]][-1] == "message_stop"


def test_sync_sdk_same_answers(standin_thread: RunningStandIn, make_proxy_thread: Any) -> None:
    proxy = make_proxy_thread(standin_thread.url)
    results = []
    for base in (standin_thread.url, proxy.url):
        with anthropic.Anthropic(base_url=base, api_key="sk-test") as client:
            message = client.messages.create(**REQUEST)
            events = dumped(client.messages.create(**REQUEST, stream=True))
            with client.messages.stream(
                **REQUEST, extra_headers={"x-stand-in": TOOL_SCRIPT}
            ) as stream:
                streamed = dumped(stream)
                final = stream.get_final_message()
            results.append((message.model_dump(), events, streamed, final.model_dump()))
    direct, proxied = results
    assert proxied == direct
    assert direct[3]["content"][-1]["input"] == {"p": "src", "deep": True}
