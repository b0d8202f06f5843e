"""The scripted coding agent's loop, one for every API; each API is an adapter (agent*.py).

The agent has one task; turn after turn it asks the model (the stand-in, scripted by the
`x-stand-in` header each turn sends), keeps what the model said in its history the way
that API's clients send it back, and answers every call of its tool with a large,
log-like result (a "Go on." when the model called nothing). Tests and benchmarks use it
to replay the same long conversation with and without the proxy.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import orjson

TASK = "The build fails in src/build/pipeline.py; find out why and fix it."
RULES = "You are a careful coding agent. " + "Follow the repository rules. " * 200
GO_ON = "Go on."

T = TypeVar("T")


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


def turn_script(
    turn: int,
    read_every: int,
    tool: str,
    argument: str,
    text: str | None = None,
) -> dict[str, Any]:
    """A turn's script: call `tool` with `{argument: "make step-N"}` (after `text`, when
    given), and every `read_every`-th turn read_result first (when the proxy offers it)."""
    script: dict[str, Any] = {"tool": {"name": tool, "input": {argument: f"make step-{turn}"}}}
    if text is not None:
        script["text"] = text
    if read_every and turn % read_every == read_every - 1:
        script["read_result"] = True
    return script


def script_headers(script: Mapping[str, Any], conversation: str | None = None) -> dict[str, str]:
    headers = {"x-stand-in": orjson.dumps(script).decode()}
    if conversation:
        headers["x-conversation-id"] = conversation
    return headers


def proxy_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The proxy's x-compaction-* response headers."""
    return {k: v for k, v in headers.items() if k.startswith("x-compaction")}


@dataclass
class ScriptedAgent:
    """What a scripted agent of any API is given (each names its SDK client's type)."""

    client: Any
    model: str
    stream: bool
    read_every: int  # every so many turns the model reads an offloaded result first
    conversation: str | None  # sent as x-conversation-id
    max_tokens: int
    result_chars: int


class Adapter(Protocol[T]):
    """What the loop needs of one API: its history, one turn asked, the answer read."""

    def opening(self) -> list[dict[str, Any]]:
        """The history before the first turn (instructions, the task)."""
        ...

    async def ask(self, turn: int, history: list[dict[str, Any]]) -> T:
        """Send the turn's request; its answer (and whatever the caller keeps of it)."""
        ...

    def said(self, answer: T) -> tuple[list[dict[str, Any]], list[str]]:
        """The answer as the history keeps it, and the ids of the tool calls it made."""
        ...

    def results(self, turn: int, call_ids: list[str]) -> list[dict[str, Any]]:
        """The history entries answering these calls."""
        ...

    def user(self, text: str) -> dict[str, Any]:
        """A user message in the API's shape."""
        ...


async def run(
    adapter: Adapter[T],
    turns: int,
    on_turn: Callable[[int, T], Awaitable[None]] | None = None,
) -> list[T]:
    """Run the agent for `turns` turns; every turn's answer, in order."""
    history = adapter.opening()
    done: list[T] = []
    for t in range(turns):
        answer = await adapter.ask(t, history)
        done.append(answer)
        if on_turn is not None:
            await on_turn(t, answer)
        kept, calls = adapter.said(answer)
        history.extend(kept)
        history.extend(adapter.results(t, calls) if calls else [adapter.user(GO_ON)])
    return done
