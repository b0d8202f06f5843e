"""The wire formats the proxy speaks, one `WireFormat` per API (proxy/core/wire_format.py)."""

from proxy.wire.anthropic import ANTHROPIC, AnthropicMessages
from proxy.wire.chat import CHAT, ChatCompletions

__all__ = ["ANTHROPIC", "CHAT", "AnthropicMessages", "ChatCompletions"]
