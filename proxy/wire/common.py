"""What several wire formats share, so that no format imports another.

Reading a request's message list, its output cap, OpenAI's error object (Chat
Completions and Responses spell errors alike), percent-encoding a path segment
(Bedrock's and Vertex's model ids), the counter every format's stands on
(`FormatCounter`: the shared TokenCounter and a `count_message`), and what every
format's stream merger shares: the lifecycle of an answer's read_result rounds
(`RoundsMerger`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.errors import ProxyError
from proxy.core.tokens import TokenCounter
from proxy.core.wire_format import JSON, MergeState, Round


def request_messages(body: Mapping[str, Any]) -> list[JSON]:
    """The request's messages, or [] when the field is absent or not a list."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    return [m for m in messages if isinstance(m, dict)]


def max_output(body: Mapping[str, Any]) -> int | None:
    """The request's output cap, under any of the names the APIs give it."""
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


@dataclass(frozen=True)
class OpenAIInvalid:
    """Why OpenAI's API refuses a request (its 400 `invalid_request_error`): the message,
    and the `param` and `code` it names (Chat Completions and Responses alike)."""

    message: str
    param: str | None = None
    code: str | None = None


# Anthropic's error types (the core's) that OpenAI's APIs spell otherwise.
_OPENAI_TYPES = {"api_error": "server_error", "overloaded_error": "server_error"}


def openai_error(error: ProxyError) -> dict[str, Any]:
    """The proxy's error as OpenAI's error object (Chat Completions and Responses)."""
    kind = _OPENAI_TYPES.get(error.type, error.type)
    return {"message": error.message, "type": kind, "param": error.param, "code": error.code}


def head_text(message: Mapping[str, Any], render: Callable[[Sequence[Any]], str]) -> str:
    """A message's leading text (`Dialect.head_text`): its string content, else its first
    block's non-blank text or content, else its first line as `render` (the format's
    transcript) writes it, else its role."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict):
            for key in ("text", "content"):
                value = block.get(key)
                if isinstance(value, str) and value.strip():
                    return value
    lines = render([message]).splitlines()
    return lines[1] if len(lines) > 1 else str(message.get("role", ""))


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~")
_ESCAPE = re.compile(rb"%([0-9A-Fa-f]{2})")


def percent_encode(segment: str) -> str:
    """A path segment with everything but RFC 3986's unreserved characters escaped (as
    botocore writes a URI label, `:` and `/` included)."""
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in segment.encode())


def percent_decode(segment: str) -> str:
    """A path segment with its %XX escapes decoded (invalid UTF-8 replaced)."""
    raw = _ESCAPE.sub(lambda m: bytes((int(m[1], 16),)), segment.encode())
    return raw.decode("utf-8", "replace")


class FormatCounter:
    """A format's `MessageCounter` (proxy/core/wire_format.py): the shared TokenCounter
    (and its cache) for text, content, blocks, tools and results, and the format's own
    `count_message` (what one message of its shape costs); a format whose blocks are
    shaped otherwise counts those too."""

    def __init__(self, base: TokenCounter) -> None:
        self.base = base

    def count_message(self, message: Mapping[str, Any]) -> int:
        raise NotImplementedError

    def count_text(self, text: str) -> int:
        return self.base.count_text(text)

    def count_content(self, content: object) -> int:
        return self.base.count_content(content)

    def count_block(self, block: object) -> int:
        return self.base.count_block(block)

    def count_tools(self, tools: object) -> int:
        return self.base.count_tools(tools)

    def count_result(self, content: object) -> int:
        return self.base.count_result(content)


# -- a streamed answer's rounds ---------------------------------------------------------


class RoundsMerger:
    """What every format's stream merger keeps of an answer's rounds (a `RoundMerger`,
    proxy/core/wire_format.py): how many were begun, the one being read (begun open, ended
    as a `Round`), whether a read_result call was held back in any of them and the output
    tokens of those calls. It calls nothing of the format's: each format's merger begins,
    reads and ends its rounds itself and writes the answer's one ending (`finish`: the
    upstream's own when `ends_as_upstream`, else what the format's merge policy tells the
    client, the stop reason its own and the usage it acts on: the functions that merge
    the format's whole answers too), so the transport talks to one object, in one module.
    """

    def __init__(self, tool: str) -> None:
        self.tool = tool  # read_result's name in this request
        self.rounds = 0
        self.round = Round()  # the round being read
        self.state = MergeState.OPEN
        self.held_any = False  # a read_result call was held back, in some round
        self.held_tokens = 0  # output the client did not see (those calls)

    def next_round(self) -> None:
        """A round begins: counted, open, nothing read of it yet."""
        self.rounds += 1
        self.round = Round()
        self.state = MergeState.OPEN

    def ends_as_upstream(self, note: str | None) -> bool:
        """Whether the answer ends as the upstream ended it: one round, nothing held back,
        no note due (every event then went out as the very bytes that came in)."""
        return self.rounds == 1 and not self.held_any and note is None


def never_deferred(body: Mapping[str, Any], tool: str) -> bool:
    """`Request.deferred` of a format that lists read_result always (tool search's
    deferral is the Messages API's)."""
    return False


def listed_already(body: Mapping[str, Any], tool: str) -> dict[str, Any]:
    """`Request.listed` of such a format: the body as it is."""
    return dict(body)
