"""What several wire formats share, so that no format imports another.

Reading a request's message list, its output cap, the block counter every format's
counter stands on, OpenAI's error object (Chat Completions and Responses spell errors
alike), and percent-encoding a path segment (Bedrock's and Vertex's model ids).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.errors import ProxyError
from proxy.core.wire_format import JSON


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
