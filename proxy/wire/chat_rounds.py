"""read_result rounds on Chat Completions, sans I/O (the Chat twin of anthropic_rounds).

When the model calls the injected `read_result` function, the proxy answers it and asks
again; the client sees one completion:

- `ChatStreamMerger` turns the `data:` chunks of several upstream rounds into one client
  stream: read_result tool_call deltas are held back, other tool_calls keep their order
  with indices shifted to follow those already sent, later rounds' chunks carry the first
  round's completion id, and one final chunk with the finish_reason, one usage chunk
  (when the client asked for usage) and one `[DONE]` end it. With one round and nothing
  held, every chunk goes out as the very bytes that came in.

The usage the client is told is the one it can act on (`client_usage`): the prompt of the
LAST round (what the model saw last) and the completion tokens it received (every
round's, less the read_result calls it never saw).
- `split_completion` / `merge_completions` do the same for non-streaming answers.
- `continue_messages` appends a round's assistant message and the read results;
  `ChatRounds` is the format's Rounds part (proxy/core/wire_format.py).

Only the first choice is followed: the proxy injects read_result only into requests
asking for one choice (`n` absent or 1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.core.sse import Event
from proxy.core.usage import Usage, call_tokens, count
from proxy.core.wire_format import MergeState, ReadCall, Round
from proxy.wire.common import RoundsMerger

DONE = "[DONE]"
ROUND_SEPARATOR = "\n\n"  # between the text of two rounds, so sentences do not run on


def chat_usage(raw: Mapping[str, Any]) -> Usage:
    """Chat usage in the core's terms: prompt_tokens counts every input token, the cached
    ones (prompt_tokens_details.cached_tokens) included."""
    prompt = count(raw.get("prompt_tokens"))
    details = raw.get("prompt_tokens_details")
    cached = count(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
    cached = min(cached, prompt)
    return Usage(
        input_tokens=prompt - cached,
        cache_read_input_tokens=cached,
        output_tokens=count(raw.get("completion_tokens")),
    )


def client_usage(rounds: Sequence[object], held_tokens: int) -> dict[str, Any]:
    """The last round's usage, with the completion tokens of all rounds less
    `held_tokens` (and the total made of the two)."""
    usages = [u for u in rounds if isinstance(u, dict)]
    if not usages:
        return {}
    out = dict(usages[-1])
    completion = sum(count(u.get("completion_tokens")) for u in usages)
    out["completion_tokens"] = max(0, completion - held_tokens)
    out["total_tokens"] = count(out.get("prompt_tokens")) + out["completion_tokens"]
    return out


def _held_tokens(call: Mapping[str, Any]) -> int:
    function = call.get("function")
    arguments = function.get("arguments") if isinstance(function, Mapping) else None
    return call_tokens(len(arguments) if isinstance(arguments, str) else 0)


def _read_call(call: dict[str, Any]) -> ReadCall:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    try:
        parsed = orjson.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except orjson.JSONDecodeError:
        parsed = None  # parse_read_args answers the model with what it got wrong
    return ReadCall(str(call.get("id", "")), parsed)


def is_read(call: object, tool: str) -> bool:
    """A read_result call: held back from the client, whole or streamed."""
    if not isinstance(call, dict):
        return False
    function = call.get("function")
    return isinstance(function, dict) and function.get("name") == tool


def told_stop(reason: Any, client_calls: bool) -> Any:
    """The finish_reason the client is told: tool_calls only when a call of its own
    waits (a held read_result call is not the client's to answer)."""
    return "stop" if reason == "tool_calls" and not client_calls else reason


# -- non-streaming ------------------------------------------------------------------------


def _first_choice(completion: dict[str, Any]) -> dict[str, Any]:
    choices = completion.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return {}


def split_completion(completion: dict[str, Any], tool: str) -> Round:
    choice = _first_choice(completion)
    message = dict(choice.get("message") or {})
    calls = [c for c in message.get("tool_calls") or () if isinstance(c, dict)]
    reads = [_read_call(c) for c in calls if is_read(c, tool)]
    usage = completion.get("usage")
    return Round(
        assistant=_assistant(message),
        reads=reads,
        client_calls=len(calls) - len(reads),
        stop_reason=choice.get("finish_reason"),
        usage=chat_usage(usage if isinstance(usage, dict) else {}),
        asks_to_read=choice.get("finish_reason") == "tool_calls",
    )


def _assistant(message: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message a round continues with: its text and every tool call."""
    return {
        "role": "assistant",
        "content": message.get("content"),
        "tool_calls": message.get("tool_calls") or [],
    }


def merge_completions(
    completions: Sequence[dict[str, Any]], tool: str, note: str | None = None
) -> dict[str, Any]:
    """One completion for the client from every round's answer: read_result calls
    removed, texts joined, the usage the client can act on, the last round's
    finish_reason; `note` ends the text with a short line of the proxy's."""
    first, last = completions[0], completions[-1]
    texts: list[str] = []
    calls: list[Any] = []
    held = 0
    for completion in completions:
        message = _first_choice(completion).get("message") or {}
        content = message.get("content")
        if isinstance(content, str) and content:
            texts.append(content)
        for call in message.get("tool_calls") or ():
            if is_read(call, tool):
                held += _held_tokens(call)
            else:
                calls.append(call)
    if note is not None:
        texts.append(note)
    choice = dict(_first_choice(first))
    message = dict(choice.get("message") or {})
    message["content"] = ROUND_SEPARATOR.join(texts) if texts else None
    if calls:
        message["tool_calls"] = calls
    else:
        message.pop("tool_calls", None)
    reason = told_stop(_first_choice(last).get("finish_reason"), bool(calls))
    choice.update(message=message, finish_reason=reason)
    out = {**first, "choices": [choice]}
    if any(isinstance(c.get("usage"), dict) for c in completions):
        out["usage"] = client_usage([c.get("usage") for c in completions], held)
    return out


def continue_messages(
    messages: Sequence[Any], round_: Round, results: Sequence[tuple[str, str, bool]]
) -> list[Any]:
    """The request's messages plus the round's assistant message and the read results."""
    answers = [
        {"role": "tool", "tool_call_id": call_id, "content": text} for call_id, text, _ in results
    ]
    return [*messages, round_.assistant, *answers]


# -- streaming ----------------------------------------------------------------------------


def encode_chunk(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


DONE_EVENT = b"data: [DONE]\n\n"


class ChatStreamMerger(RoundsMerger):
    """Several streamed rounds, one client completion (RoundMerger)."""

    def __init__(self, tool: str) -> None:
        super().__init__(tool)
        self._head: dict[str, Any] = {}  # id, object, created, model of the first chunk
        self._next_index = 0  # the next client tool_call index
        self._sent_text = False
        self._usages: list[dict[str, Any]] = []  # every finished round's usage, as given
        self._usage_seen = False
        self._reset()

    def begin_round(self) -> None:
        self.next_round()
        self._reset()

    def _reset(self) -> None:
        self._raw_usage: dict[str, Any] = {}
        self._index_map: dict[int, int | None] = {}  # upstream index -> client (None: held)
        self._calls: dict[int, dict[str, Any]] = {}
        self._text: list[str] = []
        self._separated = False
        self._held: list[bytes] = []  # this round's finish chunk and usage chunk
        self._done: Event | None = None

    def feed(self, event: Event) -> list[bytes]:
        data_text = event.data.strip()
        if event.name == "" or not data_text:
            return [event.raw]
        if data_text == DONE:
            self._done = event
            self.state = MergeState.STOPPED
            return []
        try:
            data = orjson.loads(data_text)
        except orjson.JSONDecodeError:
            return [event.raw]
        if not isinstance(data, dict):
            return [event.raw]
        if data.get("error"):
            self.state = MergeState.FAILED
            return [event.raw]
        if not self._head:
            self._head = {k: data[k] for k in ("id", "object", "created", "model") if k in data}
        if isinstance(data.get("usage"), dict):
            self._raw_usage = dict(data["usage"])
            self._usage_seen = True
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            if isinstance(data.get("usage"), dict):
                self._held.append(event.raw)  # the usage chunk: sent summed at the end
                return []
            return [event.raw]
        return self._choice_chunk(event, data, choices)

    def _choice_chunk(self, event: Event, data: dict[str, Any], choices: list[Any]) -> list[bytes]:
        changed = False
        kept = []
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                kept.append(choice)
                continue
            choice = dict(choice)
            delta = dict(choice.get("delta") or {})
            if choice.get("finish_reason") is not None:
                # Held: only the last round's reason reaches the client. A chunk that also
                # carries a delta sends the delta now and keeps a finish-only copy.
                self.round.stop_reason = choice["finish_reason"]
                if _empty_delta(delta):
                    self._held.append(event.raw)
                else:
                    alone = {**choice, "delta": {}}
                    self._held.append(encode_chunk({**data, "choices": [alone]}))
                choice["finish_reason"] = None
                changed = True
            if self.rounds > 1 and "role" in delta:
                del delta["role"]  # the client saw the assistant message begin once
                changed = True
            text = delta.get("content")
            if isinstance(text, str) and text:
                if self.rounds > 1 and self._sent_text and not self._separated:
                    delta["content"] = ROUND_SEPARATOR + text
                    changed = True
                self._separated = True
                self._text.append(text)
            if "tool_calls" in delta:
                calls, calls_changed = self._tool_call_deltas(delta["tool_calls"])
                changed = changed or calls_changed
                if calls:
                    delta["tool_calls"] = calls
                else:
                    del delta["tool_calls"]
            choice["delta"] = delta
            if _empty_delta(delta) and choice.get("finish_reason") is None and changed:
                continue  # nothing left for the client in this choice
            kept.append(choice)
        if self.rounds > 1 and self._head.get("id") != data.get("id"):
            data.update(self._head)
            changed = True
        if not changed:
            self._mark_text_sent()
            return [event.raw]
        if not kept:
            return []
        data["choices"] = kept
        self._mark_text_sent()
        return [encode_chunk(data)]

    def _mark_text_sent(self) -> None:
        if self._text:
            self._sent_text = True

    def _tool_call_deltas(self, deltas: object) -> tuple[list[Any], bool]:
        if not isinstance(deltas, list):
            return [], True
        out: list[Any] = []
        changed = False
        for delta in deltas:
            if not isinstance(delta, dict):
                out.append(delta)
                continue
            index = int(delta.get("index", 0))
            call = self._calls.setdefault(index, {"function": {"arguments": ""}})
            if delta.get("id") is not None:
                call["id"] = delta["id"]
            if delta.get("type") is not None:
                call["type"] = delta["type"]
            function = delta.get("function") or {}
            if function.get("name") is not None:
                call["function"]["name"] = function["name"]
            if function.get("arguments"):
                call["function"]["arguments"] += function["arguments"]
            if index not in self._index_map:
                if is_read(call, self.tool):
                    self._index_map[index] = None
                    self.held_any = True
                else:
                    self._index_map[index] = self._next_index
                    self._next_index += 1
            client = self._index_map[index]
            if client is None:
                changed = True
                continue
            if client != index:
                delta = {**delta, "index": client}
                changed = True
            out.append(delta)
        return out, changed

    def end_round(self) -> Round:
        """The round just finished (after its last chunk, or after the stream ended)."""
        round_ = self.round
        calls = []
        for index in sorted(self._calls):
            call = self._calls[index]
            entry = {"id": call.get("id"), "type": call.get("type", "function")}
            entry["function"] = call["function"]
            calls.append(entry)
            if self._index_map.get(index) is None:
                round_.reads.append(_read_call(entry))
                self.held_tokens += _held_tokens(entry)
            else:
                round_.client_calls += 1
        text = "".join(self._text)
        round_.assistant = {"role": "assistant", "content": text or None, "tool_calls": calls}
        round_.usage = chat_usage(self._raw_usage)
        round_.asks_to_read = round_.stop_reason == "tool_calls"
        if self._raw_usage:
            self._usages.append(dict(self._raw_usage))
        return round_

    def finish(self, note: str | None = None) -> list[bytes]:
        """The closing chunks: the upstream's own when they stand, else the merge
        policy's, ending with `note` when the proxy has one (why the rounds stopped)."""
        if self.ends_as_upstream(note):
            return [*self._held, self._done.raw] if self._done is not None else list(self._held)
        last = self.round
        reason = told_stop(last.stop_reason, last.client_calls > 0)
        head = {**self._head, "object": "chat.completion.chunk"}
        out = []
        if note is not None:
            text = ROUND_SEPARATOR + note if self._sent_text else note
            said = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
            out.append(encode_chunk({**head, "choices": [said]}))
        final = {
            **head,
            "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}],
        }
        out.append(encode_chunk(final))
        if self._usage_seen:
            usage = client_usage(self._usages, self.held_tokens)
            out.append(encode_chunk({**head, "choices": [], "usage": usage}))
        out.append(DONE_EVENT)
        return out


def _empty_delta(delta: dict[str, Any]) -> bool:
    return not any(v not in (None, "", []) for v in delta.values())


class ChatRounds:
    """The Chat format's `Rounds` (proxy/core/wire_format.py): this module's
    functions and its merger."""

    split = staticmethod(split_completion)
    merge = staticmethod(merge_completions)
    continue_messages = staticmethod(continue_messages)
    merger = ChatStreamMerger  # made per answer: ChatStreamMerger(tool)
