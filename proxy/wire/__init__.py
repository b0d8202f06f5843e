"""The wire formats the proxy speaks, one per API, each a class made of the small parts of
proxy/core/wire_format.py (`Request`, `Dialect`, `Summaries`, `Rounds`, `UsageReader`,
`ErrorShapes`). No format imports another; what they share is in proxy/wire/common.py."""

from proxy.wire.anthropic import ANTHROPIC, AnthropicMessages
from proxy.wire.chat import CHAT, ChatCompletions
from proxy.wire.gemini import GEMINI, GeminiAPI
from proxy.wire.responses import RESPONSES, ResponsesAPI

__all__ = [
    "ANTHROPIC",
    "CHAT",
    "GEMINI",
    "RESPONSES",
    "AnthropicMessages",
    "ChatCompletions",
    "GeminiAPI",
    "ResponsesAPI",
]
