"""The stand-in's Responses API over WebSocket, driven by aiohttp's own WebSocket client as
Codex drives the real one: prewarm, incremental frames with previous_response_id, error
frames, and what closes the socket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.testing.api_responses import ResponsesOptions
from proxy.testing.standin import StandInOptions
from tests.plugins.responses import MakeResponsesStandIn
from tests.plugins.standin import RunningStandIn

BETA = {"OpenAI-Beta": "responses_websockets=2026-02-06"}
AUTH = {"authorization": "Bearer sk-responses"}
EXEC = {
    "type": "function",
    "name": "exec_command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def create(items: list[Any], **extra: Any) -> dict[str, Any]:
    return {
        "type": "response.create",
        "model": "gpt-test",
        "input": items,
        "tools": [EXEC],
        **extra,
    }


async def until_done(ws: aiohttp.ClientWebSocketResponse) -> list[dict[str, Any]]:
    """The events of one response, up to its end (or an error frame)."""
    events = []
    while True:
        message = await ws.receive(timeout=10)
        assert message.type == aiohttp.WSMsgType.TEXT, message
        event = orjson.loads(message.data)
        events.append(event)
        if event["type"] in ("response.completed", "response.incomplete", "response.failed"):
            return events
        if event["type"] == "error" and "status" in event:
            return events


async def standin_with(make: MakeResponsesStandIn, window: int = 200_000, **extra: Any) -> Any:
    return await make(
        StandInOptions(windows={"*": window}), ResponsesOptions(websocket_status=101, **extra)
    )


@pytest.fixture
async def standin(make_responses_standin: MakeResponsesStandIn) -> RunningStandIn:
    return await standin_with(make_responses_standin)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def frames(standin: RunningStandIn) -> list[Any]:
    return [r for r in standin.recorded if r.transport == "websocket"]


async def test_prewarm_then_incremental_frames_extend_the_kept_response(
    standin: RunningStandIn, session: aiohttp.ClientSession
) -> None:
    script = {"x-stand-in": orjson.dumps({"text": "Sure."}).decode()}
    async with session.ws_connect(
        standin.url + "/v1/responses", headers={**AUTH, **BETA, **script}, compress=15
    ) as ws:
        assert ws.compress  # permessage-deflate agreed
        first = [user("hello")]
        await ws.send_str(orjson.dumps(create(first, generate=False)).decode())
        prewarm = await until_done(ws)
        assert [e["type"] for e in prewarm] == ["response.created", "response.completed"]
        assert prewarm[-1]["response"]["output"] == []
        warm_id = prewarm[-1]["response"]["id"]

        await ws.send_str(orjson.dumps(create([], previous_response_id=warm_id)).decode())
        answered = await until_done(ws)
        assert answered[0]["type"] == "response.created"
        assert [e["sequence_number"] for e in answered] == list(range(len(answered)))
        done = answered[-1]["response"]
        assert done["status"] == "completed" and done["usage"]["input_tokens"] > 0
        [message] = done["output"]
        assert message["content"][0]["text"] == "Sure."

        more = [user("and then?")]
        frame = create(more, previous_response_id=done["id"])
        await ws.send_str(orjson.dumps(frame).decode())
        again = await until_done(ws)
        assert again[-1]["type"] == "response.completed"

        # Only the most recent response is kept: the prewarm's id no longer resolves.
        await ws.send_str(orjson.dumps(create(more, previous_response_id=warm_id)).decode())
        [error] = await until_done(ws)
        assert error["status"] == 400
        assert error["error"]["code"] == "previous_response_not_found"

    sent = frames(standin)
    assert [r.status for r in sent] == [200, 200, 200, 400]
    assert sent[0].kind == "prewarm"
    resolved = [orjson.loads(r.resolved) for r in sent[:3]]
    assert resolved[1]["input"] == first  # the prewarm's input, nothing new
    assert resolved[2]["input"] == [*first, message, *more]
    assert "previous_response_id" not in resolved[2] and "type" not in resolved[2]
    assert orjson.loads(sent[2].body)["input"] == more  # as the frame had it


async def test_error_frames_and_closes(
    standin: RunningStandIn, session: aiohttp.ClientSession
) -> None:
    url = standin.url + "/v1/responses"
    rate_limited = {"x-stand-in": orjson.dumps({"fault": "429", "fault_times": 1}).decode()}
    async with session.ws_connect(url, headers={**AUTH, **BETA, **rate_limited}) as ws:
        await ws.send_str(orjson.dumps(create([user("hi")])).decode())
        [error] = await until_done(ws)
        assert error["type"] == "error" and error["status"] == 429
        assert error["error"]["code"] == "rate_limit_exceeded"
        assert int(error["headers"]["retry-after"]) >= 1
        # Other frame types, and bad JSON, are refused on the socket, which stays open.
        await ws.send_str(orjson.dumps({"type": "response.cancel"}).decode())
        [error] = await until_done(ws)
        assert error["status"] == 400 and error["error"]["param"] == "type"
        await ws.send_str("{not json")
        [error] = await until_done(ws)
        assert error["status"] == 400
        # A request the HTTP route refuses is refused the same way.
        await ws.send_str(orjson.dumps({"type": "response.create", "input": []}).decode())
        [error] = await until_done(ws)
        assert error["status"] == 400 and error["error"]["type"] == "invalid_request_error"
        # A binary frame closes it.
        await ws.send_bytes(b"\x00")
        closing = await ws.receive(timeout=10)
        assert closing.type == aiohttp.WSMsgType.CLOSE
        assert closing.data == aiohttp.WSCloseCode.UNSUPPORTED_DATA

    # Before the upgrade: a credential is required.
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await session.ws_connect(url, headers=BETA)
    assert refused.value.status == 401


async def test_window_faults_and_frame_size(
    make_responses_standin: MakeResponsesStandIn, session: aiohttp.ClientSession
) -> None:
    standin = await standin_with(make_responses_standin, window=50, websocket_max_frame=4096)
    url = standin.url + "/v1/responses"
    async with session.ws_connect(url, headers={**AUTH, **BETA}) as ws:
        await ws.send_str(orjson.dumps(create([user("word " * 200)])).decode())
        events = await until_done(ws)
        kinds = [e["type"] for e in events]
        assert kinds == ["response.created", "response.in_progress", "error", "response.failed"]
        assert events[2]["code"] == "context_length_exceeded"
        await ws.send_str(orjson.dumps(create([user("x" * 5000)])).decode())
        closing = await ws.receive(timeout=10)
        assert closing.type == aiohttp.WSMsgType.CLOSE
        assert closing.data == aiohttp.WSCloseCode.MESSAGE_TOO_BIG

    cut = {"x-stand-in": orjson.dumps({"fault": "eof", "text": "a b c d e f"}).decode()}
    async with session.ws_connect(url, headers={**AUTH, **BETA, **cut}) as ws:
        await ws.send_str(orjson.dumps(create([user("hi")])).decode())
        seen = []
        while True:
            message = await ws.receive(timeout=10)
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            seen.append(orjson.loads(message.data)["type"])
        assert "response.output_text.delta" in seen and "response.completed" not in seen
        assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    assert frames(standin)[-1].outcome == "cut"
