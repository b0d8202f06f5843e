"""The wire formats the proxy speaks, one `WireFormat` per API (proxy/core/wire_format.py)."""

from proxy.wire.anthropic import ANTHROPIC, AnthropicMessages
from proxy.wire.chat import CHAT, ChatCompletions
from proxy.wire.responses import RESPONSES, ResponsesAPI

__all__ = ["ANTHROPIC", "CHAT", "RESPONSES", "AnthropicMessages", "ChatCompletions", "ResponsesAPI"]
