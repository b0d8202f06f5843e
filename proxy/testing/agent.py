"""The scripted coding agent (agent_loop.py) on the Messages API, through the anthropic SDK.

Like Claude Code it marks the system prompt and its newest message with `cache_control`,
moving that breakpoint forward every turn, and calls its `Bash` tool.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anthropic

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

SYSTEM = [{"type": "text", "text": RULES, "cache_control": {"type": "ephemeral"}}]
TOOLS = [
    {
        "name": "Bash",
        "description": "Run a shell command in the repository and return its output.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    }
]
__all__ = ["TASK", "TOOLS", "Turn", "run_agent", "tool_output"]


@dataclass
class Turn:
    message: Any  # the SDK's Message
    headers: dict[str, str] = field(default_factory=dict)  # the proxy's x-compaction-* headers


def _with_breakpoint(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with cache_control on the newest block only (as Claude Code does)."""
    out = [dict(m) for m in messages]
    last = dict(out[-1])
    content = last["content"]
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    content = [dict(b) for b in content]
    content[-1]["cache_control"] = {"type": "ephemeral"}
    last["content"] = content
    out[-1] = last
    return out


@dataclass
class MessagesAgent(ScriptedAgent):
    client: anthropic.AsyncAnthropic
    output: Callable[[int, int], str]
    text: Callable[[int], str] | None

    def opening(self) -> list[dict[str, Any]]:
        return [self.user(TASK)]

    async def ask(self, turn: int, history: list[dict[str, Any]]) -> Turn:
        said = self.text(turn) if self.text else None
        script = turn_script(turn, self.read_every, "Bash", "command", said)
        headers = script_headers(script, self.conversation)
        request: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "system": SYSTEM,
            "tools": TOOLS,
            "messages": _with_breakpoint(history),
        }
        if self.stream:
            async with self.client.messages.stream(**request, extra_headers=headers) as s:
                return Turn(await s.get_final_message(), proxy_headers(s.response.headers))
        raw = await self.client.messages.with_raw_response.create(**request, extra_headers=headers)
        return Turn(await raw.parse(), proxy_headers(raw.headers))

    def said(self, answer: Turn) -> tuple[list[dict[str, Any]], list[str]]:
        content = [b.model_dump(exclude_none=True) for b in answer.message.content]
        calls = [b.id for b in answer.message.content if b.type == "tool_use"]
        return [{"role": "assistant", "content": content}], calls

    def results(self, turn: int, call_ids: list[str]) -> list[dict[str, Any]]:
        output = self.output(turn, self.result_chars)
        results = [{"type": "tool_result", "tool_use_id": c, "content": output} for c in call_ids]
        return [{"role": "user", "content": results}]

    def user(self, text: str) -> dict[str, Any]:
        return {"role": "user", "content": text}


async def run_agent(
    client: anthropic.AsyncAnthropic,
    *,
    turns: int,
    result_chars: int,
    model: str = "claude-test-1",
    stream: bool = False,
    read_every: int = 0,
    conversation: str | None = None,
    max_tokens: int = 1024,
    on_turn: Callable[[int, Turn], Awaitable[None]] | None = None,
    output: Callable[[int, int], str] = tool_output,
    text: Callable[[int], str] | None = None,
) -> list[Turn]:
    """`output(turn, chars)`: the tool result of a turn (a build log by default);
    `text(turn)`: the text the model writes before its tool call (none by default)."""
    agent = MessagesAgent(
        client, model, stream, read_every, conversation, max_tokens, result_chars, output, text
    )
    return await agent_loop.run(agent, turns, on_turn)
