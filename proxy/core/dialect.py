"""What the planner needs to know about a wire format, and nothing more.

The planner (rewrite.py) and checkpoints work on message indices, shapes and a few
rewritten messages; everything that depends on how a wire format spells a message sits
behind a `Dialect`: the Anthropic Messages one in proxy/wire/anthropic.py, the OpenAI
Chat one in proxy/wire/openai.py.

A tool result is addressed by (message index, slot): for Anthropic the slot is the
tool_result block's index in the user message's content; for OpenAI, where each `tool`
message holds one result, it is 0. A checkpoint's stub records that slot, so it must
mean the same thing on every request of a conversation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from proxy.core.history import Shape
from proxy.core.offload import Stub

Message = Mapping[str, Any]


class Dialect(Protocol):
    name: str

    def message_shape(self, message: Message, tokens: int) -> Shape:
        """The message's role, the tool calls it makes and the calls it answers."""
        ...

    def tool_results(self, message: Message) -> list[tuple[int, Mapping[str, Any]]]:
        """The tool results the message gives, as (slot, result). A result is a mapping
        whose `content` is a string or a list of parts (what offload.result_text reads),
        counted with the counter's count_block."""
        ...

    def stubbed_message(
        self, message: Message, stubs: Sequence[Stub], tool: str, read_length: int
    ) -> dict[str, Any]:
        """A copy of the message with the results at the stubs' slots replaced by stubs."""
        ...

    def summary_message(self, text: str, folded: int) -> dict[str, Any]: ...

    def note_message(self, text: str) -> dict[str, Any]: ...

    def render_transcript(self, messages: Sequence[Message]) -> str:
        """The messages as plain text for the summariser."""
        ...

    def read_result_tool(self, name: str) -> dict[str, Any]:
        """The injected tool's definition in this format: the same bytes every time."""
        ...
