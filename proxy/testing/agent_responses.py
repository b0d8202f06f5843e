"""The scripted coding agent (agent_loop.py) on the Responses API, through the openai SDK.

It sends what Codex sends: developer instructions and the task as input messages,
`reasoning` with `include: ["reasoning.encrypted_content"]`, `store: false`, a
`prompt_cache_key`, and turn after turn it appends the output items it got back
(reasoning, text, the call) and a large log-like `function_call_output`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import openai

from proxy.testing import agent_loop
from proxy.testing.agent_loop import (
    RULES,
    TASK,
    proxy_headers,
    script_headers,
    tool_output,
    turn_script,
)
from proxy.wire.responses_units import text_message

INSTRUCTIONS = RULES
TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a shell command in the repository and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}},
            "required": ["cmd"],
        },
        "strict": False,
    },
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch."},
]


@dataclass
class ResponsesTurn:
    response: Any  # the SDK's Response (from response.completed when streamed)
    headers: dict[str, str] = field(default_factory=dict)  # the proxy's x-compaction-*
    events: list[Any] = field(default_factory=list)  # a streamed turn's events, parsed


@dataclass
class ResponsesAgent:
    client: openai.AsyncOpenAI
    model: str
    stream: bool
    read_every: int
    thread: str
    result_chars: int

    def opening(self) -> list[dict[str, Any]]:
        return [text_message("developer", INSTRUCTIONS), self.user(TASK)]

    async def ask(self, turn: int, history: list[dict[str, Any]]) -> ResponsesTurn:
        script = turn_script(turn, self.read_every, "exec_command", "cmd", f"Running step {turn}.")
        request: dict[str, Any] = {
            "model": self.model,
            "input": [dict(i) for i in history],
            "tools": TOOLS,
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "reasoning": {"effort": "low"},
            "include": ["reasoning.encrypted_content"],
            "store": False,
            "prompt_cache_key": self.thread,
            "max_output_tokens": 1024,
        }
        create = self.client.responses.with_raw_response.create
        headers = script_headers(script)
        if not self.stream:
            raw = await create(**request, extra_headers=headers)
            return ResponsesTurn(raw.parse(), proxy_headers(raw.headers))
        raw = await create(**request, stream=True, extra_headers=headers)
        events = [event async for event in raw.parse()]
        ends = [e for e in events if e.type in ("response.completed", "response.incomplete")]
        return ResponsesTurn(
            ends[-1].response if ends else None, proxy_headers(raw.headers), events
        )

    def said(self, answer: ResponsesTurn) -> tuple[list[dict[str, Any]], list[str]]:
        output = answer.response.output
        calls = [item.call_id for item in output if item.type == "function_call"]
        return [item.model_dump(exclude_none=True) for item in output], calls

    def results(self, turn: int, call_ids: list[str]) -> list[dict[str, Any]]:
        output = tool_output(turn, self.result_chars)
        return [{"type": "function_call_output", "call_id": c, "output": output} for c in call_ids]

    def user(self, text: str) -> dict[str, Any]:
        return text_message("user", text)


async def run_responses_agent(
    client: openai.AsyncOpenAI,
    *,
    turns: int,
    result_chars: int,
    model: str = "gpt-test-1",
    stream: bool = True,
    read_every: int = 0,
    thread: str = "thread-1",
    on_turn: Callable[[int, ResponsesTurn], Awaitable[None]] | None = None,
) -> list[ResponsesTurn]:
    agent = ResponsesAgent(client, model, stream, read_every, thread, result_chars)
    return await agent_loop.run(agent, turns, on_turn)
