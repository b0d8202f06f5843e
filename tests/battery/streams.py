"""Streamed answers read the way each API's clients read them, strictly: every event in
its place (a block's deltas between its start and its stop, indices counted from 0,
one ending, sequence numbers that count), and the answer they add up to, in the API's
whole shape, for `harness.assert_answer`.

Written from the APIs' documented streams, not from the proxy's or the stand-in's code,
so that what a merged stream (read rounds) or a relayed one shows the client is checked
by a reader that knows neither. Each reader raises AssertionError on an event out of
place and returns (the answer, whether it ended in the API's error event).
"""

from __future__ import annotations

import base64
from typing import Any

import orjson
from botocore.eventstream import EventStreamBuffer

from tests.server.sse import parse_events

JSON = dict[str, Any]


def _json(text: str | bytes) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise AssertionError(f"an event that is not JSON: {text[:200]!r}") from exc


class _MessagesAnswer:
    """Anthropic's stream: message_start, then per block content_block_start (index n),
    its deltas, content_block_stop; message_delta (the stop reason), message_stop. `ping`
    anywhere; `error` ends it."""

    def __init__(self) -> None:
        self.message: JSON | None = None
        self.open: int | None = None
        self.partial = ""
        self.delta: JSON | None = None
        self.stopped = False
        self.errored = False

    def take(self, event: JSON) -> None:
        kind = event.get("type")
        assert not self.stopped and not self.errored, f"an event after the end: {kind}"
        if kind == "ping":
            return
        if kind == "error":
            assert event["error"]["message"], event
            self.errored = True
            return
        if kind == "message_start":
            assert self.message is None, "two message_start"
            self.message = event["message"]
            assert self.message["type"] == "message" and self.message["content"] == [], event
            return
        assert self.message is not None, f"{kind} before message_start"
        content: list[JSON] = self.message["content"]
        if kind == "content_block_start":
            assert self.open is None, f"block {event['index']} starts in block {self.open}"
            assert self.delta is None, "a block after message_delta"
            assert event["index"] == len(content), (event["index"], len(content))
            content.append(dict(event["content_block"]))
            self.open, self.partial = event["index"], ""
        elif kind == "content_block_delta":
            assert event["index"] == self.open, (event["index"], self.open)
            self._apply(content[event["index"]], event["delta"])
        elif kind == "content_block_stop":
            assert event["index"] == self.open, (event["index"], self.open)
            block = content[event["index"]]
            if block["type"] in ("tool_use", "server_tool_use") and self.partial:
                block["input"] = _json(self.partial)
            self.open = None
        elif kind == "message_delta":
            assert self.open is None, f"message_delta in block {self.open}"
            assert self.delta is None, "two message_delta"
            self.delta = event
            self.message.update(event["delta"])
            self.message["usage"] = {**self.message.get("usage", {}), **event.get("usage", {})}
        elif kind == "message_stop":
            assert self.delta is not None, "message_stop without message_delta"
            self.stopped = True
        else:
            raise AssertionError(f"an event Anthropic does not send: {kind}")

    def _apply(self, block: JSON, delta: JSON) -> None:
        kind = delta["type"]
        if kind == "text_delta":
            assert block["type"] == "text", (block["type"], kind)
            block["text"] += delta["text"]
        elif kind == "input_json_delta":
            assert block["type"] in ("tool_use", "server_tool_use"), (block["type"], kind)
            self.partial += delta["partial_json"]
        elif kind == "thinking_delta":
            assert block["type"] == "thinking", (block["type"], kind)
            block["thinking"] += delta["thinking"]
        elif kind == "signature_delta":
            assert block["type"] == "thinking", (block["type"], kind)
            block["signature"] = block.get("signature", "") + delta["signature"]
        else:
            raise AssertionError(f"a delta Anthropic does not send: {kind}")

    def answer(self) -> tuple[JSON, bool]:
        if self.errored:
            return self.message or {}, True
        assert self.stopped, "the stream ended without message_stop"
        assert self.message is not None
        return self.message, False


def messages_stream(body: bytes) -> tuple[JSON, bool]:
    """Anthropic's SSE (Messages, Vertex's streamRawPredict): each event named by its
    data's type."""
    reader = _MessagesAnswer()
    for name, data in parse_events(body):
        event = _json(data)
        assert event.get("type") == name, f"event {name} carries {event.get('type')}"
        reader.take(event)
    return reader.answer()


def bedrock_stream(body: bytes) -> tuple[JSON, bool]:
    """AWS's event stream (checksums checked by botocore's own parser): each `chunk`
    event's payload `{"bytes": base64}` one Anthropic event; an exception message ends
    it."""
    frames = EventStreamBuffer()
    frames.add_data(body)
    reader = _MessagesAnswer()
    for frame in frames:
        headers = frame.headers
        if headers.get(":message-type") == "exception":
            assert not reader.errored and not reader.stopped, "an exception after the end"
            reader.errored = True
            continue
        assert headers.get(":message-type") == "event", headers
        assert headers.get(":event-type") == "chunk", headers
        reader.take(_json(base64.b64decode(_json(frame.payload)["bytes"])))
    return reader.answer()


def chat_stream(body: bytes) -> tuple[JSON, bool]:
    """Chat Completions chunks, then `data: [DONE]`: one id, the role first, each tool
    call opened (index, id, name) before its arguments, one finish_reason, the usage
    chunk (no choices) after it when asked for; an `error` object ends it."""
    events = [data for _, data in parse_events(body)]
    assert events, "an empty stream"
    if events[-1] != "[DONE]":
        last = _json(events[-1])
        assert "error" in last and last["error"]["message"], f"no [DONE]: {events[-1][:200]}"
        return {}, True
    message: JSON = {"role": None, "content": None}
    calls: list[JSON] = []
    ident = None
    finish = None
    usage = None
    for data in events[:-1]:
        chunk = _json(data)
        assert chunk["object"] == "chat.completion.chunk", chunk
        assert ident in (None, chunk["id"]), "the id changed"
        ident = chunk["id"]
        if not chunk["choices"]:
            assert chunk.get("usage") and finish is not None and usage is None, chunk
            usage = chunk["usage"]
            continue
        assert usage is None, "a choice after the usage chunk"
        (choice,) = chunk["choices"]
        assert finish is None, "a chunk after finish_reason"
        delta = choice["delta"]
        if delta.get("role"):
            assert message["role"] is None, "the role twice"
            message["role"] = delta["role"]
        assert message["role"] == "assistant", "a delta before the role"
        if delta.get("content"):
            message["content"] = (message["content"] or "") + delta["content"]
        for call in delta.get("tool_calls") or []:
            if call["index"] == len(calls):
                assert call["id"] and call["function"]["name"], call
                function = {"name": call["function"]["name"], "arguments": ""}
                calls.append({"id": call["id"], "type": "function", "function": function})
            assert call["index"] == len(calls) - 1, (call["index"], len(calls))
            calls[-1]["function"]["arguments"] += call["function"].get("arguments") or ""
        finish = choice.get("finish_reason") or finish
    assert finish is not None, "no finish_reason"
    for call in calls:
        _json(call["function"]["arguments"])
    if calls:
        message["tool_calls"] = calls
        assert finish == "tool_calls", finish
    whole = {"object": "chat.completion", "id": ident, "usage": usage,
             "choices": [{"index": 0, "message": message, "finish_reason": finish}]}  # fmt: skip
    return whole, False


_RESPONSES_ENDS = ("response.completed", "response.incomplete", "response.failed")


def responses_stream(body: bytes) -> tuple[JSON, bool]:
    """Responses events: sequence numbers counting from 0, response.created first, each
    output item added (output_index n) and done in turn, its events between; the last
    event the response's end, whose output is the items done."""
    events = parse_events(body)
    assert events, "an empty stream"
    done: list[JSON] = []
    open_index: int | None = None
    end: JSON | None = None
    for n, (name, data) in enumerate(events):
        event = _json(data)
        kind = event.get("type")
        assert kind == name, f"event {name} carries {kind}"
        assert end is None, f"{kind} after the end"
        if kind == "error":
            assert event.get("message") or event.get("error"), event
            assert n == len(events) - 1, "events after the error"
            return {}, True
        assert event["sequence_number"] == n, (kind, event["sequence_number"], n)
        if n == 0:
            assert kind == "response.created", kind
            continue
        if kind in _RESPONSES_ENDS:
            assert open_index is None, f"{kind} with item {open_index} open"
            end = event["response"]
        elif kind == "response.output_item.added":
            assert open_index is None, "an item added in another"
            assert event["output_index"] == len(done), (event["output_index"], len(done))
            open_index = event["output_index"]
        elif kind == "response.output_item.done":
            assert event["output_index"] == open_index, (event["output_index"], open_index)
            done.append(event["item"])
            open_index = None
        elif "output_index" in event:
            assert event["output_index"] == open_index, (kind, event["output_index"])
    assert end is not None, "the stream ended without the response's end"
    assert end["output"] == done, "the response's output is not the items streamed"
    return end, False


def gemini_chunks(chunks: list[JSON]) -> tuple[JSON, bool]:
    """GenerateContentResponse chunks: each candidate's parts appended, text parts of the
    same kind joined; the finishReason on the last."""
    assert chunks, "an empty stream"
    parts: list[JSON] = []
    finish = None
    for chunk in chunks:
        if "error" in chunk:
            assert chunk is chunks[-1] and chunk["error"]["message"], chunk
            return {}, True
        assert finish is None, "a chunk after finishReason"
        (candidate,) = chunk["candidates"]
        for part in candidate.get("content", {}).get("parts", []):
            joins = parts and "text" in part and "text" in parts[-1]
            if joins and bool(part.get("thought")) == bool(parts[-1].get("thought")):
                parts[-1] = {**parts[-1], "text": parts[-1]["text"] + part["text"]}
            else:
                parts.append(dict(part))
        finish = candidate.get("finishReason")
    assert finish is not None, "no finishReason"
    whole = {"candidates": [{"content": {"role": "model", "parts": parts},
                             "finishReason": finish}],
             "usageMetadata": chunks[-1].get("usageMetadata")}  # fmt: skip
    return whole, False


def gemini_sse(body: bytes) -> tuple[JSON, bool]:
    return gemini_chunks([_json(data) for _, data in parse_events(body)])


def gemini_array(body: bytes) -> tuple[JSON, bool]:
    """The JSON array form: the whole body one array of chunks."""
    chunks = _json(body)
    assert isinstance(chunks, list), f"not an array: {body[:200]!r}"
    return gemini_chunks(chunks)


READERS = {
    ("messages", "sse"): messages_stream,
    ("vertex", "sse"): messages_stream,
    ("bedrock", "eventstream"): bedrock_stream,
    ("chat", "sse"): chat_stream,
    ("chat", "sse_usage"): chat_stream,
    ("responses", "sse"): responses_stream,
    ("gemini", "sse"): gemini_sse,
    ("gemini", "array"): gemini_array,
}
