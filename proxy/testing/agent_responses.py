"""The scripted tool-using agent of agent.py, on the Responses API, through the openai SDK.

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
import orjson

from proxy.testing.agent import TASK, proxy_headers, tool_output

INSTRUCTIONS = "You are a careful coding agent. " + "Follow the repository rules. " * 200
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


def message(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


@dataclass
class ResponsesTurn:
    response: Any  # the SDK's Response (from response.completed when streamed)
    headers: dict[str, str] = field(default_factory=dict)  # the proxy's x-compaction-*
    events: list[Any] = field(default_factory=list)  # a streamed turn's events, parsed


def turn_script(turn: int, read_every: int) -> dict[str, str]:
    script: dict[str, Any] = {
        "text": f"Running step {turn}.",
        "tool": {"name": "exec_command", "input": {"cmd": f"make step-{turn}"}},
    }
    if read_every and turn % read_every == read_every - 1:
        script["read_result"] = True
    return {"x-stand-in": orjson.dumps(script).decode()}


async def ask(
    client: openai.AsyncOpenAI, request: dict[str, Any], headers: dict[str, str], stream: bool
) -> ResponsesTurn:
    if not stream:
        raw = await client.responses.with_raw_response.create(**request, extra_headers=headers)
        return ResponsesTurn(raw.parse(), proxy_headers(raw.headers))
    raw = await client.responses.with_raw_response.create(
        **request, stream=True, extra_headers=headers
    )
    events = [event async for event in raw.parse()]
    completed = [e for e in events if e.type in ("response.completed", "response.incomplete")]
    response = completed[-1].response if completed else None
    return ResponsesTurn(response, proxy_headers(raw.headers), events)


def as_input(item: Any) -> dict[str, Any]:
    """An output item as the client sends it back."""
    data: dict[str, Any] = item.model_dump(exclude_none=True)
    return data


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
    items: list[dict[str, Any]] = [message("developer", INSTRUCTIONS), message("user", TASK)]
    done: list[ResponsesTurn] = []
    for t in range(turns):
        request: dict[str, Any] = {
            "model": model,
            "input": [dict(i) for i in items],
            "tools": TOOLS,
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "reasoning": {"effort": "low"},
            "include": ["reasoning.encrypted_content"],
            "store": False,
            "prompt_cache_key": thread,
            "max_output_tokens": 1024,
        }
        turn = await ask(client, request, turn_script(t, read_every), stream)
        done.append(turn)
        if on_turn is not None:
            await on_turn(t, turn)
        output = turn.response.output
        items.extend(as_input(item) for item in output)
        calls = [item for item in output if item.type == "function_call"]
        if not calls:
            items.append(message("user", "Go on."))
        for call in calls:
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": call.call_id,
                    "output": tool_output(t, result_chars),
                }
            )
    return done
