"""The stand-in's answer before any API shapes it: what the model says, calls and spends.

The script (script.py) or a scenario decides a `Reply`; each API's renderer (api_*.py)
turns it into that API's JSON, stream events or frames. Ids are the renderer's: it derives
them from `Reply.digest` (the request's hash), so the same request gets the same answer,
streamed or not; a call the scenario names carries its own id.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Any

from proxy.core.tokens import TokenCounter


@dataclass(frozen=True)
class Call:
    """A tool call: made by the stand-in, or read from a request's history."""

    name: str
    input: Any  # the arguments, parsed (a custom tool's: its text)
    id: str | None = None  # None: the renderer derives one from the request's digest


class Stop(Enum):
    END = "end"  # the model is done
    TOOL = "tool"  # it waits for its calls' results
    LENGTH = "length"  # its text reached the output limit


@dataclass(frozen=True)
class Reply:
    digest: str  # the request's hash (hex), ids derive from it
    text: str | None = None
    calls: tuple[Call, ...] = ()
    thinking: str | None = None  # reasoning shown before the answer
    compaction: str | None = None  # a compaction item's summary (Codex's compaction_trigger)
    cut: bool = False  # the text was cut at the output limit (and its calls dropped)
    output_tokens: int = 1
    reasoning_tokens: int = 0
    kind: str = ""  # what the request was taken for (scenario.py's kinds, "summary")

    @property
    def stop(self) -> Stop:
        if self.cut:
            return Stop.LENGTH
        return Stop.TOOL if self.calls else Stop.END


@dataclass(frozen=True)
class Usage:
    """What a request cost, in the upstream's tokens: the whole prompt, the parts of it read
    from and written to the prompt cache, and the answer."""

    prompt: int
    cache_read: int = 0
    cache_write: int = 0
    write_1h: bool = False  # the written prefix is a one-hour entry
    output: int = 1
    reasoning: int = 0

    @property
    def fresh(self) -> int:
        """The prompt neither read from nor written to the cache."""
        return max(0, self.prompt - self.cache_read - self.cache_write)


def counted(reply: Reply, counter: TokenCounter) -> Reply:
    """The reply with its output tokens: its thinking, its text, each call's name and
    arguments, as the project's counter counts them (at least 1)."""
    thinking = counter.count_text(reply.thinking) if reply.thinking else 0
    total = thinking + (counter.count_text(reply.text) if reply.text else 0)
    for call in reply.calls:
        arguments = call.input if isinstance(call.input, str) else None
        total += counter.count_text(call.name)
        total += counter.count_text(arguments) if arguments else counter.count_json(call.input)
    if reply.compaction:
        total += counter.count_text(reply.compaction)
    return dataclasses.replace(reply, output_tokens=max(1, total), reasoning_tokens=thinking)
