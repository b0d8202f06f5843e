"""One script, one answer: the same history and script get the same text, calls and stop
from every API the stand-in serves, whole or streamed, read through each API's SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import orjson
import pytest

from tests.plugins.standin import RunningStandIn

REF = "r_0123456789abcdef"
STUB = f'[first 200 of 9000 characters] read_result(ref="{REF}", start=0, length=2000)'
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}}
# (the script, what every API answers: text, calls (name, input), stop)
CASES = [
    ({"read_result": True}, (None, [("read_result", {"ref": REF, "start": 0, "length": 2000})],
                             "tool")),
    (
        {"text": "Building now.", "tool": {"name": "Bash", "input": {"command": "make"}}},
        ("Building now.", [("Bash", {"command": "make"})], "tool"),
    ),
    ({"text": "Done."}, ("Done.", [], "end")),
]  # fmt: skip
Answer = tuple[str | None, list[tuple[str, Any]], str]


@pytest.fixture
async def clients(
    standin: RunningStandIn,
) -> AsyncIterator[tuple[anthropic.AsyncAnthropic, openai.AsyncOpenAI]]:
    base = standin.url
    async with (
        anthropic.AsyncAnthropic(base_url=base, api_key="sk-one", max_retries=0) as messages,
        openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-one", max_retries=0) as oai,
    ):
        yield messages, oai


async def messages_answer(client: anthropic.AsyncAnthropic, script: str, stream: bool) -> Answer:
    tools = [{"name": n, "input_schema": SCHEMA} for n in ("Bash", "read_result")]
    history = [
        {"role": "user", "content": "Look at the logs."},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "c1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": STUB}]},
    ]  # fmt: skip
    request: dict[str, Any] = {"model": "m", "max_tokens": 500, "tools": tools, "messages": history}
    headers = {"x-stand-in": script}
    if stream:
        async with client.messages.stream(**request, extra_headers=headers) as s:
            message = await s.get_final_message()
    else:
        message = await client.messages.create(**request, extra_headers=headers)
    text = "".join(b.text for b in message.content if b.type == "text") or None
    calls = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
    return text, calls, {"tool_use": "tool", "end_turn": "end"}[str(message.stop_reason)]


async def chat_answer(client: openai.AsyncOpenAI, script: str, stream: bool) -> Answer:
    tools = [
        {"type": "function", "function": {"name": n, "parameters": SCHEMA}}
        for n in ("Bash", "read_result")
    ]
    call = {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}
    history = [
        {"role": "user", "content": "Look at the logs."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": STUB},
    ]
    request: dict[str, Any] = {"model": "m", "tools": tools, "messages": history}
    headers = {"x-stand-in": script}
    if stream:
        async with client.chat.completions.stream(**request, extra_headers=headers) as s:
            completion = await s.get_final_completion()
    else:
        completion = await client.chat.completions.create(**request, extra_headers=headers)
    choice = completion.choices[0]
    calls = [
        (c.function.name, orjson.loads(c.function.arguments))
        for c in choice.message.tool_calls or []
        if c.type == "function"
    ]
    stop = {"tool_calls": "tool", "stop": "end"}[choice.finish_reason]
    # A stream's first chunk carries content "": the SDK keeps it for a text-less answer.
    return choice.message.content or None, calls, stop


async def responses_answer(client: openai.AsyncOpenAI, script: str, stream: bool) -> Answer:
    tools = [{"type": "function", "name": n, "parameters": SCHEMA} for n in ("Bash", "read_result")]
    history = [
        {"type": "message", "role": "user", "content": "Look at the logs."},
        {"type": "function_call", "call_id": "c1", "name": "Bash", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": STUB},
    ]
    request: dict[str, Any] = {"model": "m", "tools": tools, "input": history}
    headers = {"x-stand-in": script}
    if stream:
        async with client.responses.stream(**request, extra_headers=headers) as s:
            response = await s.get_final_response()
    else:
        response = await client.responses.create(**request, extra_headers=headers)
    calls = [
        (i.name, orjson.loads(i.arguments)) for i in response.output if i.type == "function_call"
    ]
    return response.output_text or None, calls, "tool" if calls else "end"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(("script", "expected"), CASES, ids=["read", "tool", "text"])
async def test_every_api_gives_the_scripts_one_answer(
    clients: tuple[anthropic.AsyncAnthropic, openai.AsyncOpenAI],
    script: dict[str, Any],
    expected: Answer,
    stream: bool,
) -> None:
    messages, oai = clients
    header = orjson.dumps(script).decode()
    assert await messages_answer(messages, header, stream) == expected
    assert await chat_answer(oai, header, stream) == expected
    assert await responses_answer(oai, header, stream) == expected
