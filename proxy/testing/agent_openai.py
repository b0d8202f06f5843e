"""The scripted tool-using agent of agent.py, in OpenAI Chat format, through the openai SDK.

One task, then turn after turn the model (the stand-in, scripted by `x-stand-in`) calls
the client's Bash function and the agent answers with a large log-like tool message, as
an OpenAI-format coding agent would. No cache_control: OpenAI caches prefixes itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import openai
from openai.lib.streaming.chat import ChatCompletionStreamState

from proxy.testing.agent import TASK, proxy_headers, tool_output, turn_headers

SYSTEM = "You are a careful coding agent. " + "Follow the repository rules. " * 200
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Run a shell command in the repository and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


@dataclass
class ChatTurn:
    completion: Any  # the SDK's ChatCompletion (assembled from chunks when streamed)
    headers: dict[str, str] = field(default_factory=dict)  # the proxy's x-compaction-* headers
    chunks: list[Any] = field(default_factory=list)  # a streamed turn's chunks, as parsed


async def _streamed(
    client: openai.AsyncOpenAI, request: dict[str, Any], headers: dict[str, str]
) -> tuple[Any, dict[str, str], list[Any]]:
    """A streamed completion, its response headers and its chunks; the SDK's own
    accumulator assembles the completion."""
    raw = await client.chat.completions.with_raw_response.create(
        **request, stream=True, extra_headers=headers
    )
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState(input_tools=request["tools"])
    chunks = []
    async for chunk in raw.parse():
        chunks.append(chunk)
        state.handle_chunk(chunk)
    return state.get_final_completion(), dict(raw.headers), chunks


async def run_openai_agent(
    client: openai.AsyncOpenAI,
    *,
    turns: int,
    result_chars: int,
    model: str = "gpt-test-1",
    stream: bool = False,
    read_every: int = 0,
    conversation: str | None = None,
    max_tokens: int = 1024,
    on_turn: Callable[[int, ChatTurn], Awaitable[None]] | None = None,
) -> list[ChatTurn]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": TASK},
    ]
    done: list[ChatTurn] = []
    for t in range(turns):
        headers = turn_headers(t, read_every, conversation)
        request: dict[str, Any] = {
            "model": model,
            "max_completion_tokens": max_tokens,
            "tools": TOOLS,
            "messages": [dict(m) for m in messages],
        }
        if stream:
            request["stream_options"] = {"include_usage": True}
            completion, raw_headers, chunks = await _streamed(client, request, headers)
        else:
            raw = await client.chat.completions.with_raw_response.create(
                **request, extra_headers=headers
            )
            completion, raw_headers, chunks = raw.parse(), dict(raw.headers), []
        turn = ChatTurn(completion, proxy_headers(raw_headers), chunks)
        done.append(turn)
        if on_turn is not None:
            await on_turn(t, turn)
        message = completion.choices[0].message
        calls = message.tool_calls or []
        assistant: dict[str, Any] = {"role": "assistant", "content": message.content}
        if calls:
            assistant["tool_calls"] = [c.model_dump(exclude_none=True) for c in calls]
        messages.append(assistant)
        if not calls:
            messages.append({"role": "user", "content": "Go on."})
            continue
        for c in calls:
            messages.append(
                {"role": "tool", "tool_call_id": c.id, "content": tool_output(t, result_chars)}
            )
    return done
