"""read_result rounds on the Messages API, sans I/O (the `Rounds` of proxy/core/wire_format.py).

When the model calls the injected `read_result` tool, the proxy answers it and asks
again; the client sees one ordinary message. This module holds the pure parts:

- `StreamMerger` turns the SSE events of several upstream rounds into one client stream:
  read_result blocks are held back, every other block is passed on with its index
  shifted to follow the blocks already sent, and one `message_delta`/`message_stop`
  closes the message. With one round and nothing held, every event goes out as the very
  bytes that came in.

The client is told the usage it can act on (`client_usage`): the input of the LAST
round (what the model saw last; agents size their context from it, and a sum over rounds
would make them compact for nothing) and the output it received (every round's, less the
read_result calls it never saw). The request's meter keeps the true totals.
- `split_message` / `merge_messages` do the same for non-streaming answers.
- `continue_messages` appends a round's assistant turn and the read results to a request.
- `MessagesRounds` is the format's Rounds part, and `anthropic_usage` reads a usage object.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.core.sse import Event, encode_event
from proxy.core.usage import Usage, call_tokens, count
from proxy.core.wire_format import MergeState, ReadCall, Round
from proxy.wire.common import RoundsMerger


def anthropic_usage(raw: Mapping[str, Any]) -> Usage:
    """A Messages usage object in the core's terms."""
    detail = raw.get("cache_creation")
    hour = count(detail.get("ephemeral_1h_input_tokens")) if isinstance(detail, Mapping) else 0
    return Usage(
        count(raw.get("input_tokens")),
        count(raw.get("cache_creation_input_tokens")),
        count(raw.get("cache_read_input_tokens")),
        count(raw.get("output_tokens")),
        hour,
    )


def client_usage(rounds: Sequence[object], held_tokens: int) -> dict[str, Any]:
    """The usage of the last round, with the output of all rounds less `held_tokens`."""
    usages = [u for u in rounds if isinstance(u, dict)]
    if not usages:
        return {}
    out = dict(usages[-1])
    output = sum(u["output_tokens"] for u in usages if isinstance(u.get("output_tokens"), int))
    out["output_tokens"] = max(0, output - held_tokens)
    return out


def is_read(block: object, tool: str) -> bool:
    """A read_result call: held back from the client, whole or streamed."""
    return isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") == tool


def told_stop(reason: Any, client_calls: bool) -> Any:
    """The stop reason the client is told: tool_use only when a call of its own waits
    (a held read_result call is not the client's to answer)."""
    return "end_turn" if reason == "tool_use" and not client_calls else reason


_INPUTS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def consistent_with_start(usage: dict[str, Any], start: Mapping[str, Any]) -> dict[str, Any]:
    """The final usage of a stream whose message_start told `start`, such that a client
    merging the two either way ends with the final figures: some clients (Claude Code)
    keep a message_start count unless the message_delta's is non-zero, so an input field
    that was non-zero at the start must not be zero at the end. One token moves from the
    largest other input field for each such field; the total input stays exact."""
    out = dict(usage)
    for name in _INPUTS:
        if _int(start.get(name)) > 0 and _int(out.get(name)) == 0:
            donor = max((n for n in _INPUTS if n != name), key=lambda n: _int(out.get(n)))
            if _int(out.get(donor)) >= 2:
                out[donor] = _int(out.get(donor)) - 1
                out[name] = 1
    written = _int(out.get("cache_creation_input_tokens"))
    detail = out.get("cache_creation")
    if isinstance(detail, dict):
        hour = min(written, _int(detail.get("ephemeral_1h_input_tokens")))
        out["cache_creation"] = {
            **detail,
            "ephemeral_5m_input_tokens": written - hour,
            "ephemeral_1h_input_tokens": hour,
        }
    return out


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def note_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


class StreamMerger(RoundsMerger):
    """Several streamed rounds, one client message (RoundMerger)."""

    def __init__(self, tool: str) -> None:
        super().__init__(tool)
        self._next_index = 0
        self._usages: list[dict[str, Any]] = []  # every finished round's usage, as given
        self._start_usage: dict[str, Any] = {}  # what the client's message_start told
        self._reset()

    def begin_round(self) -> None:
        self.next_round()
        self._reset()

    def _reset(self) -> None:
        self._raw_usage: dict[str, Any] = {}  # this round's usage as the upstream gave it
        self._stop_sequence: Any = None
        self._index_map: dict[int, int | None] = {}  # upstream index -> client (None: held)
        self._blocks: dict[int, dict[str, Any]] = {}
        self._partial: dict[int, str] = {}
        self._last_delta: Event | None = None
        self._last_stop: Event | None = None

    def feed(self, event: Event) -> list[bytes]:
        name = event.name
        if name == "error":
            self.state = MergeState.FAILED
            return [event.raw]
        if name in ("", "ping") or not event.data:
            return [event.raw]
        if name == "message_start":
            data = _loads(event.data)
            message = data.get("message") or {}
            self._raw_usage = dict(message.get("usage") or {})
            if self.rounds == 1:
                self._start_usage = dict(self._raw_usage)
                return [event.raw]
            return []
        if name == "content_block_start":
            return self._block_start(event)
        if name in ("content_block_delta", "content_block_stop"):
            return self._block_event(event)
        if name == "message_delta":
            data = _loads(event.data)
            delta = data.get("delta") or {}
            self.round.stop_reason = delta.get("stop_reason")
            self._stop_sequence = delta.get("stop_sequence")
            self._raw_usage.update(data.get("usage") or {})
            self._last_delta = event
            return []
        if name == "message_stop":
            self._last_stop = event
            self.state = MergeState.STOPPED
            return []
        return [event.raw]  # an event type we do not know: pass it on as it came

    def end_round(self) -> Round:
        """The round just finished (after its last event, or after the stream ended)."""
        round_ = self.round
        content: list[dict[str, Any]] = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            if index in self._partial:
                block["input"] = _parse_input(self._partial[index])
            content.append(block)
            if block.get("type") == "tool_use":
                if self._index_map.get(index) is None:
                    round_.reads.append(ReadCall(str(block.get("id", "")), block.get("input")))
                    self.held_tokens += call_tokens(len(self._partial.get(index, "")))
                else:
                    round_.client_calls += 1
        round_.assistant = {"role": "assistant", "content": content}
        round_.usage = anthropic_usage(self._raw_usage)
        round_.asks_to_read = round_.stop_reason == "tool_use"
        self._usages.append(dict(self._raw_usage))
        return round_

    def finish(self, note: str | None = None) -> list[bytes]:
        """The closing events: the upstream's own when they stand, else the merge
        policy's, ending with `note` when the proxy has one (why the rounds stopped)."""
        last_stop = self._last_stop
        if self.ends_as_upstream(note) and self._last_delta is not None and last_stop is not None:
            return [self._last_delta.raw, last_stop.raw]
        out: list[bytes] = []
        if note is not None:
            out += _text_block_events(self._next_index, note)
            self._next_index += 1
        last = self.round
        delta = {
            "type": "message_delta",
            "delta": {
                "stop_reason": told_stop(last.stop_reason, last.client_calls > 0),
                "stop_sequence": self._stop_sequence,
            },
            "usage": consistent_with_start(
                client_usage(self._usages, self.held_tokens), self._start_usage
            ),
        }
        stop = {"type": "message_stop"}
        return [
            *out,
            encode_event("message_delta", orjson.dumps(delta)),
            encode_event("message_stop", orjson.dumps(stop)),
        ]

    def _block_start(self, event: Event) -> list[bytes]:
        data = _loads(event.data)
        index = int(data.get("index", 0))
        block = dict(data.get("content_block") or {})
        self._blocks[index] = block
        if is_read(block, self.tool):
            self._index_map[index] = None
            self.held_any = True
            return []
        client = self._next_index
        self._next_index += 1
        self._index_map[index] = client
        return [_with_index(event, data, client)]

    def _block_event(self, event: Event) -> list[bytes]:
        data = _loads(event.data)
        index = int(data.get("index", 0))
        if event.name == "content_block_delta":
            _apply_delta(self._blocks.setdefault(index, {}), self._partial, index, data)
        client = self._index_map.get(index)
        if client is None:
            return []  # a held read_result block
        return [_with_index(event, data, client)]


def _text_block_events(index: int, text: str) -> list[bytes]:
    start = {"type": "content_block_start", "index": index, "content_block": note_block("")}
    delta = {
        "type": "content_block_delta",
        "index": index,
        "delta": {"type": "text_delta", "text": text},
    }
    stop = {"type": "content_block_stop", "index": index}
    return [
        encode_event("content_block_start", orjson.dumps(start)),
        encode_event("content_block_delta", orjson.dumps(delta)),
        encode_event("content_block_stop", orjson.dumps(stop)),
    ]


def _loads(data: str) -> dict[str, Any]:
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _with_index(event: Event, data: dict[str, Any], client: int) -> bytes:
    if data.get("index") == client:
        return event.raw
    data["index"] = client
    return encode_event(event.name, orjson.dumps(data))


def _apply_delta(
    block: dict[str, Any], partial: dict[int, str], index: int, data: dict[str, Any]
) -> None:
    delta = data.get("delta") or {}
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + delta.get("text", "")
    elif kind == "input_json_delta":
        partial[index] = partial.get(index, "") + delta.get("partial_json", "")
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
    elif kind == "signature_delta":
        block["signature"] = delta.get("signature", "")
    elif kind == "citations_delta":
        block.setdefault("citations", []).append(delta.get("citation"))


def _parse_input(partial: str) -> Any:
    if not partial:
        return {}
    try:
        return orjson.loads(partial)
    except orjson.JSONDecodeError:
        return {}


# -- non-streaming ------------------------------------------------------------------------


def split_message(message: dict[str, Any], tool: str) -> Round:
    content = [b for b in message.get("content") or [] if isinstance(b, dict)]
    reads = [ReadCall(str(b.get("id", "")), b.get("input")) for b in content if is_read(b, tool)]
    calls = sum(1 for b in content if b.get("type") == "tool_use" and not is_read(b, tool))
    usage = message.get("usage")
    return Round(
        assistant={"role": "assistant", "content": content},
        reads=reads,
        client_calls=calls,
        stop_reason=message.get("stop_reason"),
        usage=anthropic_usage(usage if isinstance(usage, dict) else {}),
        asks_to_read=message.get("stop_reason") == "tool_use",
    )


def merge_messages(
    messages: Sequence[dict[str, Any]], tool: str, note: str | None = None
) -> dict[str, Any]:
    """One message for the client from every round's answer: read_result calls removed,
    content joined, the usage the client can act on (`client_usage`), the last round's
    stop; `note` ends it with a short text block of the proxy's."""
    first, last = messages[0], messages[-1]
    content: list[Any] = []
    held = 0
    for m in messages:
        for b in m.get("content") or []:
            if is_read(b, tool):
                held += call_tokens(len(orjson.dumps(b.get("input", {}))))
            else:
                content.append(b)
    if note is not None:
        content.append(note_block(note))
    usage = client_usage([m.get("usage") for m in messages], held)
    calls = any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content)
    return {
        **first,
        "content": content,
        "stop_reason": told_stop(last.get("stop_reason"), calls),
        "stop_sequence": last.get("stop_sequence"),
        "usage": usage,
    }


def continue_messages(
    messages: Sequence[Any], round_: Round, results: Sequence[tuple[str, str, bool]]
) -> list[Any]:
    """The request's messages plus the round's assistant turn and the read results."""
    answers = [
        {"type": "tool_result", "tool_use_id": call_id, "content": text, "is_error": error}
        for call_id, text, error in results
    ]
    return [*messages, round_.assistant, {"role": "user", "content": answers}]


class MessagesRounds:
    """The Messages format's `Rounds` (proxy/core/wire_format.py): this module's
    functions and its merger."""

    split = staticmethod(split_message)
    merge = staticmethod(merge_messages)
    continue_messages = staticmethod(continue_messages)
    merger = StreamMerger  # made per answer: StreamMerger(tool)
