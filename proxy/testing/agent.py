"""A scripted tool-using agent, driven through the real anthropic SDK.

It behaves like a coding agent: one task, then turn after turn the model (the stand-in,
scripted by the `x-stand-in` header) calls a client tool and the agent answers with a
large, log-like tool result. Like Claude Code it marks the system prompt and its newest
message with `cache_control`, moving that breakpoint forward every turn. Tests and
benchmarks use it to replay the same long conversation with and without the proxy.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anthropic
import orjson

TASK = "The build fails in src/build/pipeline.py; find out why and fix it."
SYSTEM = [
    {
        "type": "text",
        "text": "You are a careful coding agent. " + "Follow the repository rules. " * 200,
        "cache_control": {"type": "ephemeral"},
    },
]
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


def tool_output(turn: int, chars: int) -> str:
    """A deterministic build log of about `chars` characters, full of identifiers."""
    lines = []
    size = 0
    i = 0
    while size < chars:
        line = (
            f"2026-11-29T10:{turn % 60:02d}:{i % 60:02d}Z INFO step={i} turn={turn}"
            f" src/build/module_{turn}_{i % 17}.py:{i * 7 + 3} elapsed_ms={i * 13 % 997}"
            f" cache_key=k{turn:03d}{i:05d}\n"
        )
        lines.append(line)
        size += len(line)
        i += 1
    return "".join(lines)[:chars]


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


def turn_headers(
    turn: int, read_every: int, conversation: str | None, text: str | None = None
) -> dict[str, str]:
    """The request headers of a turn: the stand-in calls Bash (after `text`, when given),
    and every `read_every`-th turn read_result first (when the proxy offers it)."""
    script: dict[str, Any] = {"tool": {"name": "Bash", "input": {"command": f"make step-{turn}"}}}
    if text is not None:
        script["text"] = text
    if read_every and turn % read_every == read_every - 1:
        script["read_result"] = True
    headers = {"x-stand-in": orjson.dumps(script).decode()}
    if conversation:
        headers["x-conversation-id"] = conversation
    return headers


def proxy_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The proxy's x-compaction-* response headers."""
    return {k: v for k, v in headers.items() if k.startswith("x-compaction")}


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
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    done: list[Turn] = []
    for t in range(turns):
        headers = turn_headers(t, read_every, conversation, text(t) if text else None)
        request: dict[str, Any] = {
            "model": model,
            "max_tokens": max_tokens,
            "system": SYSTEM,
            "tools": TOOLS,
            "messages": _with_breakpoint(messages),
        }
        if stream:
            async with client.messages.stream(**request, extra_headers=headers) as s:
                message = await s.get_final_message()
                raw_headers = s.response.headers
        else:
            raw = await client.messages.with_raw_response.create(**request, extra_headers=headers)
            message = await raw.parse()
            raw_headers = raw.headers
        turn = Turn(message, proxy_headers(raw_headers))
        done.append(turn)
        if on_turn is not None:
            await on_turn(t, turn)
        content = [b.model_dump(exclude_none=True) for b in message.content]
        messages.append({"role": "assistant", "content": content})
        calls = [b for b in message.content if b.type == "tool_use"]
        if not calls:
            messages.append({"role": "user", "content": "Go on."})
            continue
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": c.id,
                        "content": output(t, result_chars),
                    }
                    for c in calls
                ],
            }
        )
    return done
