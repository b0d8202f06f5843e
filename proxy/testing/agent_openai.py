"""The scripted coding agent (agent_loop.py) on Chat Completions, through the openai SDK.

It calls the client's Bash function and answers with one tool message per call, as an
OpenAI-format coding agent would. No cache_control: OpenAI caches prefixes itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import openai
from openai.lib.streaming.chat import ChatCompletionStreamState

from proxy.testing import agent_loop
from proxy.testing.agent_loop import (
    RULES,
    TASK,
    ScriptedAgent,
    proxy_headers,
    script_headers,
    tool_output,
    turn_script,
)

SYSTEM = RULES
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


@dataclass
class ChatAgent(ScriptedAgent):
    client: openai.AsyncOpenAI

    def opening(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": SYSTEM}, self.user(TASK)]

    async def ask(self, turn: int, history: list[dict[str, Any]]) -> ChatTurn:
        script = turn_script(turn, self.read_every, "Bash", "command")
        headers = script_headers(script, self.conversation)
        request: dict[str, Any] = {
            "model": self.model,
            "max_completion_tokens": self.max_tokens,
            "tools": TOOLS,
            "messages": [dict(m) for m in history],
        }
        create = self.client.chat.completions.with_raw_response.create
        if not self.stream:
            raw = await create(**request, extra_headers=headers)
            return ChatTurn(raw.parse(), proxy_headers(raw.headers))
        # Streamed: the SDK's own accumulator assembles the completion from the chunks.
        request["stream_options"] = {"include_usage": True}
        raw = await create(**request, stream=True, extra_headers=headers)
        state: ChatCompletionStreamState[Any] = ChatCompletionStreamState(
            input_tools=request["tools"]
        )
        chunks = []
        async for chunk in raw.parse():
            chunks.append(chunk)
            state.handle_chunk(chunk)
        return ChatTurn(state.get_final_completion(), proxy_headers(raw.headers), chunks)

    def said(self, answer: ChatTurn) -> tuple[list[dict[str, Any]], list[str]]:
        message = answer.completion.choices[0].message
        calls = message.tool_calls or []
        assistant: dict[str, Any] = {"role": "assistant", "content": message.content}
        if calls:
            assistant["tool_calls"] = [c.model_dump(exclude_none=True) for c in calls]
        return [assistant], [c.id for c in calls]

    def results(self, turn: int, call_ids: list[str]) -> list[dict[str, Any]]:
        output = tool_output(turn, self.result_chars)
        return [{"role": "tool", "tool_call_id": c, "content": output} for c in call_ids]

    def user(self, text: str) -> dict[str, Any]:
        return {"role": "user", "content": text}


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
    agent = ChatAgent(client, model, stream, read_every, conversation, max_tokens, result_chars)
    return await agent_loop.run(agent, turns, on_turn)
