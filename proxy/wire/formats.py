"""The pure, per-format steps around the planner: what the server's `Wire` and the
ops simulator share.

A `Format` says how to count a request of its wire format (the counter wrapper and the
system prompt + tools), which name read_result takes in it (None: offload is off), and
which part of the body identifies the conversation. `Wire` (proxy/server/wires.py) adds
the I/O-facing steps (summariser call, error answers, round merging) on top of one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.core.dialect import Dialect
from proxy.core.offload import choose_tool_name
from proxy.core.tokens import TokenCounter
from proxy.wire import openai as chat
from proxy.wire.anthropic import ANTHROPIC


@dataclass(frozen=True, slots=True)
class Format:
    name: str
    dialect: Dialect
    counter: Callable[[TokenCounter], Any]  # the counter for this format's messages
    fixed_tokens: Callable[[Any, Mapping[str, Any]], int]  # system prompt + tools
    tool_name: Callable[[Mapping[str, Any]], str | None]  # read_result's name; None: off
    identity_view: Callable[[Mapping[str, Any]], Mapping[str, Any]]  # for conversation_of


def _anthropic_fixed(counter: Any, body: Mapping[str, Any]) -> int:
    return int(counter.count_system(body.get("system")) + counter.count_tools(body.get("tools")))


def _anthropic_counter(base: TokenCounter) -> Any:
    return base


def _anthropic_tool_name(body: Mapping[str, Any]) -> str | None:
    return choose_tool_name(body.get("tools"))


def _body_itself(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body


ANTHROPIC_FORMAT = Format(
    name="anthropic",
    dialect=ANTHROPIC,
    counter=_anthropic_counter,
    fixed_tokens=_anthropic_fixed,
    tool_name=_anthropic_tool_name,
    identity_view=_body_itself,
)


def _chat_fixed(counter: Any, body: Mapping[str, Any]) -> int:
    return int(counter.count_tools(body.get("tools")))


def _chat_tool_name(body: Mapping[str, Any]) -> str | None:
    n = body.get("n")
    if n not in (None, 1):
        return None  # several choices: the rounds follow one, so offload stays off
    return chat.choose_tool_name(body.get("tools"))


CHAT_FORMAT = Format(
    name="openai",
    dialect=chat.OPENAI,
    counter=chat.ChatCounter,
    fixed_tokens=_chat_fixed,
    tool_name=_chat_tool_name,
    identity_view=chat.identity_view,
)
