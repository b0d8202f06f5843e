"""What the core needs of a wire format (an API's request and answer shapes): protocols only.

A format is a few small parts, one concern each, and every caller takes the one it needs:

- `Request`: what a request is (its history in and out, its encoding, counting it, the
  name read_result takes in it, what identifies its conversation, its output cap and
  cache breakpoints);
- `Dialect`: how the planner sees a history and rebuilds it (message shapes, tool
  results, a message's head text, stubs, summary and note messages, a transcript, the
  read_result tool, a breakpoint): every message the proxy writes is built by the
  format, and every message the core reads is read through it;
- `Summaries`: the summariser's request in the format, and its answer's text;
- `Rounds`: read_result rounds (split an answer, merge several, continue a request, a
  `RoundMerger` for streams);
- `UsageReader` (with `UsageScan`): usage in answers; `ErrorShapes`: the API's errors.

`WireFormat` is all of them: what a route picks (proxy/wire/ has one per API: Anthropic
Messages, OpenAI Chat Completions, OpenAI Responses, each a class made of its parts).
The core holds neutral types only (`Shape`, `Stub`, `ToolResult`, `Round`, `Usage`,
`IdentityView`) and imports nothing outside proxy/core.

A tool result is addressed by (message index, block): for Anthropic the block is the
tool_result block's index in the user message's content; for Chat, where each `tool`
message holds one result, it is 0. A checkpoint's stub records that block, so it must
mean the same thing on every request of a conversation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from proxy.core.errors import ProxyError
from proxy.core.history import Shape
from proxy.core.offload import ToolResult
from proxy.core.sse import Event
from proxy.core.tokens import TokenCounter
from proxy.core.usage import Usage, UsageScan
from proxy.core.validated import Validated

Message = Mapping[str, Any]
JSON = dict[str, Any]


class MessageCounter(Protocol):
    """Token estimates for one format's messages (on top of the shared block counter)."""

    def count_message(self, message: Message) -> int: ...
    def count_block(self, block: object) -> int: ...
    def count_content(self, content: object) -> int: ...
    def count_tools(self, tools: object) -> int: ...
    def count_text(self, text: str) -> int: ...
    def count_result(self, content: object) -> int: ...


@dataclass(frozen=True, slots=True)
class IdentityView:
    """What identifies a conversation in a request's body, in no API's shape (each format
    makes it): the part that stays fixed at its start, the first message after that (the
    system prompt alone is shared by many conversations), a conversation id the body
    itself names, and the Messages-style metadata in which Claude Code names its session.
    proxy/core/identity.py hashes `lead` and `first` as they are: their JSON is what
    stored conversations are keyed by, so a format never changes how it makes them."""

    lead: object = None  # a system prompt, or the leading system/developer messages
    first: object = None  # the first message after the lead; None when there is none
    hint: str = ""  # a conversation id the body names (Responses' prompt_cache_key)
    metadata: object = None  # a `metadata` object, where `user_id` may hold a session


@dataclass(frozen=True, slots=True)
class ReadCall:
    """One read_result call the model made: its call id and its (parsed) input."""

    id: str
    input: object


@dataclass(slots=True)
class Round:
    """What one upstream answer held, in any format."""

    assistant: JSON = field(default_factory=dict)  # the format's assistant turn, to continue
    reads: list[ReadCall] = field(default_factory=list)  # read_result calls
    client_calls: int = 0  # calls of the client's own tools
    stop_reason: str | None = None  # the format's own word (stop_reason, finish_reason)
    usage: Usage = field(default_factory=Usage)
    asks_to_read: bool = False  # stopped to have read_result answered, nothing else waits

    @property
    def wants_reads_only(self) -> bool:
        return self.asks_to_read and bool(self.reads) and not self.client_calls


class MergeState(Enum):
    """Where a streamed round stands, as the merger has seen it."""

    OPEN = "open"  # events are still coming
    STOPPED = "stopped"  # the round's answer ended normally
    FAILED = "failed"  # the upstream sent an error inside the stream


class RoundMerger(Protocol):
    """Turns the events of several streamed upstream rounds into one client stream:
    read_result calls held back, the rest passed on renumbered, one ending."""

    state: MergeState

    def begin_round(self) -> None: ...
    def feed(self, event: Event) -> list[bytes]: ...
    def end_round(self) -> Round: ...
    def finish(self, note: str | None = None) -> list[bytes]: ...

    @property
    def rounds(self) -> int: ...


class Request(Protocol):
    """What a request of the API is: its history in and out, counted and identified."""

    name: str
    # The top-level field holding the history list ("messages", "input"): where the
    # bytes a conversation's next request repeats are found (proxy/core/reuse.py).
    history_field: str

    def messages(self, body: Mapping[str, Any]) -> list[JSON]:
        """The request's history (every message a JSON object), or [] when absent."""
        ...

    def with_history(
        self,
        body: Mapping[str, Any],
        messages: list[JSON],
        tool: str | None,
        tool_search: bool = False,
    ) -> JSON:
        """The top-level fields a rewrite replaces: the history, and the tools with
        read_result appended when `tool` names it (`tool_search`: the client's request
        has tool search on, so read_result may join deferred where the format has it)."""
        ...

    def deferred(self, body: Mapping[str, Any], tool: str) -> bool:
        """Whether read_result (`tool`) goes deferred in this body (a rewrite's)."""
        ...

    def listed(self, body: Mapping[str, Any], tool: str) -> JSON:
        """The body with read_result (`tool`) listed where it went deferred: sent instead
        should the upstream refuse the deferral (the same plan otherwise)."""
        ...

    def counter(self, base: TokenCounter) -> MessageCounter: ...
    def fixed_tokens(self, counter: MessageCounter, body: Mapping[str, Any]) -> int:
        """System prompt and tools, estimated."""
        ...

    def tool_name(self, body: Mapping[str, Any]) -> str | None:
        """The name read_result takes in this request; None: offload is off for it."""
        ...

    def identity_view(self, body: Mapping[str, Any]) -> IdentityView:
        """What identifies the conversation (proxy/core/identity.py)."""
        ...

    def max_output(self, body: Mapping[str, Any]) -> int | None:
        """The request's output cap (max_tokens and the like), if it names one."""
        ...

    def breakpoints(self, body: Mapping[str, Any]) -> int:
        """Prompt-cache breakpoints outside the messages (system, tools); the messages' are
        counted with them (Counted.breakpoints)."""
        ...

    def request_error(
        self, body: Mapping[str, Any], model: str, memo: Validated | None = None
    ) -> str | None:
        """Why the API would refuse the body (its own rules, the strict stand-ins' too:
        proxy/wire/*_validation.py), or None. `model`: the one asked for (an envelope may
        name it in the URL's path). The proxy rewrites and summarises only a request
        this answers None for (docs/compaction.md, "Invalid requests"). `memo`: what the
        line's earlier validations kept (proxy/core/validated.py; a format may walk
        every message regardless): the same answer."""
        ...


class Dialect(Protocol):
    """The planner's view of a format: message shapes, tool results, and every message the
    proxy writes into a history, built in the format's own shape."""

    def message_shape(self, message: Message, tokens: int) -> Shape:
        """The message's role, the tool calls it makes and the calls it answers."""
        ...

    def tool_results(self, message: Message) -> list[ToolResult]:
        """The tool results the message gives, by block (what a Stub names)."""
        ...

    def gives_results(self, message: Message) -> bool:
        """Whether the message gives any tool result (`tool_results` is not empty), told
        without reading the results' texts: counting asks it of each large message it
        has not counted before (proxy/core/counting.py)."""
        ...

    def with_results(self, message: Message, texts: Mapping[int, str]) -> JSON:
        """A copy of the message with the tool results at these blocks (as `tool_results`
        numbers them) replaced by these texts, every other field kept: the stubs the
        proxy wrote (proxy/core/segments.py, `stubbed`)."""
        ...

    def summary_message(self, text: str, folded: int) -> JSON: ...

    def note_message(self, text: str) -> JSON: ...

    def render_transcript(self, messages: Sequence[Message]) -> str:
        """The messages as plain text for the summariser."""
        ...

    def head_text(self, message: Message) -> str:
        """The message's leading text, by which an in-place summary's prompt names where
        the folded turns begin and end."""
        ...

    def read_result_tool(self, name: str) -> JSON:
        """The injected tool's definition in this format: the same bytes every time."""
        ...

    def loading_tokens(
        self, counter: MessageCounter, name: str, tools: object, tool_search: bool = False
    ) -> int:
        """What the history gains where read_result (named `name`) joins the client's
        `tools` deferred, loaded by the first stub (the Messages API's `tool_reference`:
        `Request.with_history` decides, with the same `tool_search`); 0 where it is
        listed."""
        ...

    def with_breakpoint(
        self, messages: Sequence[JSON], at: int, uncached_tail: bool
    ) -> list[JSON] | None:
        """The messages with a prompt-cache breakpoint on the last block of message `at`
        (`uncached_tail`: and the client's own after it dropped), or None when the format
        has no breakpoints or that message already carries one."""
        ...

    # How many aged results are stubbed together under the trigger when the policy names
    # no batch (its offload_batch 0): 1 where the proxy places a breakpoint before the
    # next result to stub (each step then reads the turns between from the cache);
    # OFFLOAD_BATCH where the API caches repeated prefixes by itself (the history as sent
    # stays the same between batches: Codex's WebSocket frames stay incremental).
    offload_batch: int


class Summaries(Protocol):
    """The summariser's call in the format."""

    def summary_request(
        self,
        body: Mapping[str, Any],
        *,
        model: str,
        summary_tokens: int,
        prompt: str,
        history: Sequence[JSON] | None,
    ) -> JSON | None:
        """The summariser's request in this API. With `history`: in place, the
        conversation's own request with `history` as its messages and `prompt` as the
        last user message, so its prefix is read from the prompt cache (None when the
        request cannot be reused so: a forced tool choice). Without: a request of its own,
        the instruction as system text and `prompt` (a transcript) as its one message."""
        ...

    def answer_text(self, answer: JSON) -> str:
        """The text of a (non-stream) answer."""
        ...


class Rounds(Protocol):
    """read_result rounds: several upstream answers as one client answer."""

    def split(self, answer: JSON, tool: str) -> Round: ...
    def merge(self, answers: Sequence[JSON], tool: str, note: str | None = None) -> JSON: ...
    def continue_messages(
        self, messages: Sequence[JSON], round_: Round, results: Sequence[tuple[str, str, bool]]
    ) -> list[JSON]: ...
    def merger(self, tool: str) -> RoundMerger: ...


class UsageReader(UsageScan, Protocol):
    """Usage in the format's answers: a usage object, and (UsageScan) a relayed answer's lines."""

    def usage(self, raw: Mapping[str, Any]) -> Usage:
        """An answer's usage object in the core's terms."""
        ...


class ErrorShapes(Protocol):
    """The API's errors, and where its answers carry their request id."""

    request_id_header: str

    def error_body(self, error: ProxyError, request_id: str) -> bytes:
        """The proxy's own error as this API's error body."""
        ...

    def stream_error(self, error: ProxyError) -> bytes:
        """The same, as an error inside a stream that already started."""
        ...

    def upstream_stream_error(self, payload: object, status: int) -> bytes:
        """An upstream error answer (its JSON body, or None) as an in-stream error."""
        ...


class WireFormat(Request, Dialect, Summaries, Rounds, UsageReader, ErrorShapes, Protocol):
    """A whole format, made of its parts: what a route picks for a request. Code that
    needs one concern takes that part's protocol instead."""
