"""What one socket's frames mean (proxy/wire/responses_ws.py): resolving a frame against the
socket's kept response, and sending upstream only what the upstream does not keep."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.sse import SSEDecoder, encode_event
from proxy.wire.responses_ws import (
    Kept,
    as_event,
    ends_response,
    error_frame_of,
    frame_of,
    frames_of_sse,
    kept_after,
    resolve,
    upstream_frame,
)


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def completed(response_id: str, output: list[Any]) -> dict[str, Any]:
    return {"type": "response.completed", "response": {"id": response_id, "output": output}}


ANSWER = {
    "type": "message",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "ok"}],
}


def test_a_frame_resolves_to_the_whole_request() -> None:
    frame = {"type": "response.create", "model": "m", "input": [user("a")], "tools": []}
    assert resolve(None, frame) == {"model": "m", "input": [user("a")], "tools": []}
    kept = kept_after([user("a")], completed("resp_1", [ANSWER]))
    assert kept == Kept("resp_1", (user("a"), ANSWER))
    more = {"type": "response.create", "model": "m", "previous_response_id": "resp_1"}
    assert resolve(kept, {**more, "input": [user("b")]}) == {
        "model": "m",
        "input": [user("a"), ANSWER, user("b")],
    }
    assert resolve(kept, {**more, "input": "b"})["input"][-1]["content"] == "b"  # type: ignore[index]
    # Only the most recent response is known: another id does not resolve.
    assert resolve(kept, {**more, "previous_response_id": "resp_0", "input": []}) is None
    assert resolve(None, {**more, "input": []}) is None
    # A failed response, or an error, leaves nothing to extend.
    failed = {"type": "response.failed", "response": {"id": "resp_2", "output": []}}
    assert kept_after([user("a")], failed) is None
    assert kept_after([user("a")], {"type": "error", "status": 429, "error": {}}) is None


def test_upstream_gets_only_new_items_while_the_prefix_is_unchanged() -> None:
    kept = Kept("resp_up", (user("a"), ANSWER))
    same = {"model": "m", "input": [user("a"), ANSWER, user("b")]}
    frame, reused = upstream_frame(kept, same)
    assert reused == 2
    assert frame == {
        "type": "response.create",
        "model": "m",
        "input": [user("b")],
        "previous_response_id": "resp_up",
    }
    # A crossing rewrote the prefix: the whole rewritten input, and no id.
    rewritten = {"model": "m", "input": [user("summary"), ANSWER, user("b")]}
    frame, reused = upstream_frame(kept, rewritten)
    assert reused == 0 and "previous_response_id" not in frame
    assert frame["input"] == rewritten["input"]
    # Shorter than what is kept (a rewind): whole too; nothing kept: whole.
    assert upstream_frame(kept, {"model": "m", "input": [user("a")]})[1] == 0
    assert upstream_frame(None, same)[1] == 0


def test_frames_and_events_carry_across() -> None:
    text = orjson.dumps({"type": "response.output_text.delta", "delta": "hi"}).decode()
    event = as_event(text, "response.output_text.delta")
    [decoded] = SSEDecoder().feed(event.raw)
    assert decoded.name == "response.output_text.delta" and decoded.data == text
    assert frame_of(event.raw) == text
    body = event.raw + encode_event("response.completed", b'{"type":"response.completed"}')
    assert frames_of_sse(body) == [text, '{"type":"response.completed"}']
    assert ends_response({"type": "response.incomplete"})
    assert ends_response({"type": "error", "status": 400})
    assert not ends_response({"type": "error", "code": "server_error"})  # in-stream: failed follows
    error = orjson.loads(
        error_frame_of(
            429,
            b'{"error": {"type": "rate_limit_error", "message": "slow down"}}',
            {"retry-after": "3", "content-type": "application/json"},
        )
    )
    assert error == {
        "type": "error",
        "status": 429,
        "error": {"type": "rate_limit_error", "message": "slow down"},
        "headers": {"retry-after": "3"},
    }
    plain = orjson.loads(error_frame_of(502, b"bad gateway", {}))
    assert plain["status"] == 502 and plain["error"]["message"] == "bad gateway"


ITEMS = st.lists(st.sampled_from([user("a"), user("b"), ANSWER, {"type": "reasoning"}]), max_size=6)


@settings(max_examples=60, deadline=None)
@given(kept_items=ITEMS, extra=ITEMS, rewritten=st.booleans())
def test_the_upstream_resolves_what_the_proxy_sends_to_what_it_meant(
    kept_items: list[Any], extra: list[Any], rewritten: bool
) -> None:
    """Whatever the upstream keeps and whatever goes next, the upstream (resolving the
    frame as the API does) sees exactly the input the proxy meant."""
    kept = Kept("resp_k", tuple(kept_items)) if kept_items else None
    meant = [user("summary"), *extra] if rewritten else [*kept_items, *extra]
    frame, reused = upstream_frame(kept, {"model": "m", "input": meant})
    seen = resolve(kept, frame)
    assert seen is not None and seen["input"] == meant
    assert len(frame["input"]) == len(meant) - reused
