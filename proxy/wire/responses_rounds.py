"""read_result rounds on the Responses API, sans I/O (the twin of anthropic_rounds/chat_rounds).

When the model calls the injected `read_result` function, the proxy answers it and asks
again; the client sees one response:

- what the client is shown of each round: every output item but the read_result calls,
  and a reasoning item only when an item the client sees follows it in the same round
  (the API refuses a reasoning item sent back without the item it led to; a reasoning
  item that led only to read_result calls stays with them, in the rounds the proxy sends);
- `ResponsesStreamMerger` does this on the events of several streamed rounds: the client
  gets one `response.created` and `response.in_progress`, the items' events with
  `output_index` following the items already shown and `sequence_number` counting on
  across rounds, and one final `response.completed` (or `response.incomplete`) whose
  output holds what it was shown. A reasoning item's events are held until the next item
  shows whether it goes out. With one round and nothing held, every event goes out as the
  very bytes that came in;
- `split_response` / `merge_responses` do the same for whole (non-stream) answers;
- `continue_units` appends a round's output items and the read results (as units of
  proxy/wire/responses_units.py) for the next round; `ResponsesRounds` is the format's
  Rounds part (proxy/core/wire_format.py).

Usage the client is told: the input of the last round (what the model saw last) and the
output it received (the output of the rounds that showed it something, less the
read_result calls held back); the usage meter keeps every round's. When the rounds stop
while the model was still reading (the round limit, the window, a budget), the answer
ends with one short assistant message saying why (`note`), so it is never empty.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.core.sse import Event, encode_event
from proxy.core.usage import Usage, call_tokens, count
from proxy.core.wire_format import MergeState, ReadCall, Round
from proxy.wire.common import RoundsMerger
from proxy.wire.responses_units import call_key, item_type

_HEAD = ("response.created", "response.in_progress", "response.queued")
_ENDS = ("response.completed", "response.incomplete")


def responses_usage(raw: Mapping[str, Any]) -> Usage:
    """Responses usage in the core's terms: input_tokens counts the cached ones too."""
    total = count(raw.get("input_tokens"))
    details = raw.get("input_tokens_details")
    cached = count(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
    cached = min(cached, total)
    return Usage(
        input_tokens=total - cached,
        cache_read_input_tokens=cached,
        output_tokens=count(raw.get("output_tokens")),
    )


def is_read(item: object, tool: str) -> bool:
    return (
        isinstance(item, dict) and item_type(item) == "function_call" and item.get("name") == tool
    )


def read_call(item: Mapping[str, Any]) -> ReadCall:
    arguments = item.get("arguments")
    try:
        parsed = orjson.loads(arguments) if isinstance(arguments, str) and arguments else {}
    except orjson.JSONDecodeError:
        parsed = None  # parse_read_args tells the model what it got wrong
    return ReadCall(str(item.get("call_id", "")), parsed)


def _output(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    output = response.get("output")
    return [i for i in output if isinstance(i, dict)] if isinstance(output, list) else []


def round_of(output: Sequence[dict[str, Any]], status: object, usage: object, tool: str) -> Round:
    reads = [read_call(i) for i in output if is_read(i, tool)]
    calls = sum(1 for i in output if call_key(i) is not None)
    return Round(
        assistant={"unit": "turn", "items": list(output)},
        reads=reads,
        client_calls=calls - len(reads),
        stop_reason=status if isinstance(status, str) else None,
        usage=responses_usage(usage if isinstance(usage, Mapping) else {}),
        asks_to_read=status == "completed" and bool(reads),
    )


def split_response(response: dict[str, Any], tool: str) -> Round:
    return round_of(_output(response), response.get("status"), response.get("usage"), tool)


def shown_items(output: Sequence[dict[str, Any]], tool: str, *, ending: bool) -> list[Any]:
    """What the client sees of one round's output. `ending`: the round ends the answer
    as the upstream ended it, so trailing reasoning goes out too."""
    shown: list[Any] = []
    pending: list[Any] = []
    for item in output:
        if is_read(item, tool):
            continue
        if item_type(item) == "reasoning":
            pending.append(item)
            continue
        shown.extend(pending)
        pending = []
        shown.append(item)
    return shown + pending if ending else shown


def held_tokens(output: Sequence[dict[str, Any]], tool: str) -> int:
    """Output tokens of a round's read_result calls (what the client is not shown)."""
    return sum(
        call_tokens(len(item["arguments"]) if isinstance(item.get("arguments"), str) else 0)
        for item in output
        if is_read(item, tool)
    )


def reading_message(response_id: str, note: str) -> dict[str, Any]:
    """The assistant message ending an answer whose rounds stopped while the model was
    still reading: the proxy's note saying why."""
    part = {"type": "output_text", "text": note, "annotations": [], "logprobs": []}
    return {
        "id": "msg_proxy_" + response_id.removeprefix("resp_")[-32:],
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [part],
    }


def client_usage(last: object, shown: Sequence[object], held: int = 0) -> dict[str, Any] | None:
    """The usage the client is told: the last round's input, the output of the rounds
    that showed it something less `held` (their read_result calls)."""
    if not isinstance(last, dict):
        return None
    output = sum(count(u.get("output_tokens")) for u in shown if isinstance(u, dict))
    output = max(0, output - held)
    reasoning = 0
    for usage in shown:
        details = usage.get("output_tokens_details") if isinstance(usage, dict) else None
        if isinstance(details, dict):
            reasoning += count(details.get("reasoning_tokens"))
    details = last.get("output_tokens_details")
    out = {**last, "output_tokens": output}
    out["output_tokens_details"] = {
        **(details if isinstance(details, dict) else {}),
        "reasoning_tokens": reasoning,
    }
    out["total_tokens"] = count(last.get("input_tokens")) + output
    return out


def merge_responses(
    answers: Sequence[dict[str, Any]], tool: str, note: str | None = None
) -> dict[str, Any]:
    """One response for the client from every round's answer; `note`: the rounds stopped
    while the model was still reading, and why."""
    first, last = answers[0], answers[-1]
    if len(answers) == 1 and not split_response(last, tool).reads and note is None:
        return first
    reading = note is not None
    shown: list[Any] = []
    shown_usage: list[object] = []
    held = 0
    for n, answer in enumerate(answers):
        ending = n == len(answers) - 1 and not reading
        items = shown_items(_output(answer), tool, ending=ending)
        shown.extend(items)
        if items:
            shown_usage.append(answer.get("usage"))
            held += held_tokens(_output(answer), tool)
    response_id = str(first.get("id", "resp_"))
    if note is not None:
        shown.append(reading_message(response_id, note))
    out = {**last, "id": response_id, "output": shown}
    if "created_at" in first:
        out["created_at"] = first["created_at"]
    if reading:
        out["status"] = "completed"
    if "usage" in last:
        out["usage"] = client_usage(last.get("usage"), shown_usage, held)
    return out


def continue_units(
    units: Sequence[Any], round_: Round, results: Sequence[tuple[str, str, bool]]
) -> list[Any]:
    """The request's units plus the round's output items and the read results."""
    outputs = [
        {"type": "function_call_output", "call_id": call_id, "output": text}
        for call_id, text, _ in results
    ]
    return [*units, round_.assistant, {"unit": "outputs", "items": outputs}]


# -- streaming ----------------------------------------------------------------------------

_HELD = -1  # a read_result call: its events never reach the client


class ResponsesStreamMerger(RoundsMerger):
    """Several streamed rounds, one client response (RoundMerger)."""

    def __init__(self, tool: str) -> None:
        super().__init__(tool)
        self._seq = 0  # the next sequence_number the client gets
        self._next_index = 0  # the next output_index the client gets
        self._head: dict[str, Any] = {}  # the first round's response (from created)
        self._shown: list[Any] = []  # items the client was shown, in its order
        self._shown_usage: list[object] = []  # usage of the rounds that showed something
        self._reset()

    def begin_round(self) -> None:
        self.next_round()
        self._reset()

    def _reset(self) -> None:
        self._map: dict[int, int] = {}  # upstream output_index -> client index or _HELD
        self._pending: dict[int, list[tuple[Event, dict[str, Any]]]] = {}  # reasoning
        self._items: dict[int, dict[str, Any]] = {}  # done items, by upstream index
        self._end: dict[str, Any] | None = None  # the round's completed/incomplete event
        self._end_event: Event | None = None
        self._output: list[dict[str, Any]] = []  # the round's output items
        self._showed = False

    # -- events --------------------------------------------------------------------------

    def feed(self, event: Event) -> list[bytes]:
        if event.name == "" or not event.data.strip():
            return [event.raw]
        try:
            data = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            return [event.raw]
        if not isinstance(data, dict):
            return [event.raw]
        kind = str(data.get("type") or event.name)
        if kind in _HEAD:
            if self.rounds == 1:
                if kind == "response.created" and isinstance(data.get("response"), dict):
                    self._head = data["response"]
                return [self._emit(event, data)]
            return []
        if kind in _ENDS:
            self._end, self._end_event = data, event
            self.state = MergeState.STOPPED
            return []
        if kind in ("error", "response.failed"):
            self.state = MergeState.FAILED
            return [self._emit(event, data)]
        index = data.get("output_index")
        if not isinstance(index, int) or isinstance(index, bool):
            return [self._emit(event, data)]
        if kind == "response.output_item.added":
            return self._added(event, data, index)
        return self._item_event(event, data, index, kind)

    def _added(self, event: Event, data: dict[str, Any], index: int) -> list[bytes]:
        item = data.get("item")
        if is_read(item, self.tool):
            self._map[index] = _HELD
            self.held_any = True
            return []
        if item_type(item) == "reasoning":
            self._pending[index] = [(event, data)]
            return []
        return [*self._flush_pending(), *self._show(index, event, data)]

    def _item_event(self, event: Event, data: dict[str, Any], index: int, kind: str) -> list[bytes]:
        if kind == "response.output_item.done" and isinstance(data.get("item"), dict):
            self._items[index] = data["item"]
        if index in self._pending:
            self._pending[index].append((event, data))
            return []
        client = self._map.get(index)
        if client == _HELD:
            return []
        if client is None:  # no output_item.added seen for it: show it from here
            return self._show(index, event, data)
        if kind == "response.output_item.done":
            self._shown.append(data["item"])
        return [self._emit(event, data, client)]

    def _show(self, index: int, event: Event, data: dict[str, Any]) -> list[bytes]:
        client = self._map[index] = self._next_index
        self._next_index += 1
        self._showed = True
        if data.get("type") == "response.output_item.done":
            self._shown.append(data["item"])
        return [self._emit(event, data, client)]

    def _flush_pending(self) -> list[bytes]:
        """Held reasoning goes out: an item the client sees follows it."""
        out: list[bytes] = []
        for index in sorted(self._pending):
            events = self._pending.pop(index)
            first_event, first = events[0]
            out.extend(self._show(index, first_event, first))
            for later_event, later in events[1:]:
                if later.get("type") == "response.output_item.done":
                    self._shown.append(later["item"])
                out.append(self._emit(later_event, later, self._map[index]))
        return out

    def _emit(self, event: Event, data: dict[str, Any], index: int | None = None) -> bytes:
        """The event renumbered for the client: the upstream's bytes when nothing changed.
        (An upstream that numbers no events gets none numbered.)"""
        numbered = "sequence_number" in data
        same_index = index is None or data.get("output_index") == index
        if same_index and (not numbered or data["sequence_number"] == self._seq):
            self._seq += numbered
            return event.raw
        out = dict(data)
        if numbered:
            out["sequence_number"] = self._seq
            self._seq += 1
        if index is not None:
            out["output_index"] = index
        name = event.name if event.name != "message" else str(data.get("type"))
        return encode_event(name, orjson.dumps(out))

    # -- rounds ---------------------------------------------------------------------------

    def end_round(self) -> Round:
        """The round just finished (after its last event, or after the stream ended)."""
        response = (self._end or {}).get("response")
        response = response if isinstance(response, dict) else {}
        output = _output(response) or [self._items[i] for i in sorted(self._items)]
        self._output = output
        if self._showed:
            self._shown_usage.append(response.get("usage"))
            self.held_tokens += held_tokens(output, self.tool)
        self.round = round_of(output, response.get("status"), response.get("usage"), self.tool)
        return self.round

    def finish(self, note: str | None = None) -> list[bytes]:
        """The closing events: the upstream's own when they stand (held reasoning is
        shown by the format's own ending), else the merge policy's, ending with `note`
        when the proxy has one (why the rounds stopped)."""
        end = self._end or {}
        if self.ends_as_upstream(note) and not self._pending:
            return [self._emit(self._end_event, end)] if self._end_event is not None else []
        reading = note is not None
        out: list[bytes] = []
        if reading:
            self._pending.clear()
        else:
            showed = self._showed
            out.extend(self._flush_pending())
            if self._showed and not showed:
                self._shown_usage.append((end.get("response") or {}).get("usage"))
                self.held_tokens += held_tokens(self._output, self.tool)
        response = dict(end.get("response") or {})
        response_id = str(self._head.get("id") or response.get("id") or "resp_")
        if note is not None:
            out.extend(self._reading_events(response_id, note))
        response["id"] = response_id
        if "created_at" in self._head:
            response["created_at"] = self._head["created_at"]
        response["output"] = list(self._shown)
        status = "completed" if reading else str(response.get("status") or "completed")
        response["status"] = status
        response["usage"] = client_usage(response.get("usage"), self._shown_usage, self.held_tokens)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        data = {"type": kind, "sequence_number": self._seq, "response": response}
        self._seq += 1
        out.append(encode_event(kind, orjson.dumps(data)))
        return out

    def _reading_events(self, response_id: str, note: str) -> list[bytes]:
        """The events of the assistant message saying why the rounds stopped."""
        item = reading_message(response_id, note)
        part = item["content"][0]
        index = self._next_index
        self._next_index += 1
        at = {"output_index": index, "item_id": item["id"], "content_index": 0}
        started = {**item, "status": "in_progress", "content": []}
        text = part["text"]
        events = [
            ("response.output_item.added", {"output_index": index, "item": started}),
            ("response.content_part.added", {**at, "part": {**part, "text": ""}}),
            ("response.output_text.delta", {**at, "delta": text, "logprobs": []}),
            ("response.output_text.done", {**at, "text": text, "logprobs": []}),
            ("response.content_part.done", {**at, "part": part}),
            ("response.output_item.done", {"output_index": index, "item": item}),
        ]
        out = []
        for kind, fields in events:
            data = {"type": kind, "sequence_number": self._seq, **fields}
            self._seq += 1
            out.append(encode_event(kind, orjson.dumps(data)))
        self._shown.append(item)
        return out


class ResponsesRounds:
    """The Responses format's `Rounds` (proxy/core/wire_format.py): this module's
    functions and its merger."""

    split = staticmethod(split_response)
    merge = staticmethod(merge_responses)
    continue_messages = staticmethod(continue_units)
    merger = ResponsesStreamMerger  # made per answer: ResponsesStreamMerger(tool)
