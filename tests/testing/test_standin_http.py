"""The stand-in over a real socket: the anthropic SDK, raw HTTP and raw SSE."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest
from multidict import CIMultiDict

from proxy.core.tokens import default_counter
from proxy.testing.standin import StandInOptions
from proxy.wire.anthropic_validation import NON_EMPTY
from tests.plugins.standin import RunningStandIn

# The Messages requests (Claude Code); the Codex ones are test_responses_*.py's.
AGENT_REQUESTS = sorted(
    (Path(__file__).parents[1] / "fixtures" / "agent-requests").glob("claude-code-*.json")
)
HEADERS = {"x-api-key": "test-key", "anthropic-version": "2023-06-01"}
MODEL = "claude-stand-in-test"
TOOLS = [{"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}}]
LONG_SYSTEM = " ".join(f"rule{i}" for i in range(1500))


def script(**keys: Any) -> dict[str, str]:
    return {"x-stand-in": json.dumps(keys)}


def hello(**extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 200,
        "messages": [{"role": "user", "content": "What does src/app.py do?"}],
        **extra,
    }


MakeClient = Callable[..., anthropic.AsyncAnthropic]


@pytest.fixture
async def client() -> AsyncIterator[MakeClient]:
    """Async SDK clients for a stand-in, closed after the test."""
    made: list[anthropic.AsyncAnthropic] = []

    def make(standin: RunningStandIn, **options: Any) -> anthropic.AsyncAnthropic:
        options.setdefault("api_key", "test-key")
        made.append(anthropic.AsyncAnthropic(base_url=standin.url, **options))
        return made[-1]

    yield make
    for sdk in made:
        await sdk.close()


async def post(
    standin: RunningStandIn,
    body: Any,
    headers: dict[str, str] | None = None,
    path: str = "/v1/messages",
) -> tuple[int, CIMultiDict[str], bytes]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            standin.url + path, data=data, headers=HEADERS if headers is None else headers
        ) as r,
    ):
        return r.status, CIMultiDict(r.headers), await r.read()


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for chunk in raw.decode().split("\n\n"):
        if not chunk.strip():
            continue
        lines = dict(line.split(": ", 1) for line in chunk.split("\n"))
        data = json.loads(lines["data"])
        assert data["type"] == lines["event"]  # clients dispatch on the event line
        events.append((lines["event"], data))
    return events


# -- the SDK, async and sync, stream and not ---------------------------------------


async def test_async_sdk_plain_and_streamed_answers_agree(
    standin: RunningStandIn, client: MakeClient
) -> None:
    sdk = client(standin)
    plain = await sdk.messages.create(**hello())
    async with sdk.messages.stream(**hello()) as stream:
        streamed = await stream.get_final_message()
    assert plain.id == streamed.id and plain.id.startswith("msg_")
    assert plain.content[0].type == "text"
    assert plain.content[0].text == streamed.content[0].text
    assert "24 characters" in plain.content[0].text
    assert plain.stop_reason == streamed.stop_reason == "end_turn"
    assert plain.usage.input_tokens == streamed.usage.input_tokens > 0
    assert plain.usage.output_tokens == streamed.usage.output_tokens > 0
    again = await sdk.messages.create(**hello())
    assert again.model_dump() == plain.model_dump()  # deterministic


async def test_async_sdk_tool_call_stream_and_not(
    standin: RunningStandIn, client: MakeClient
) -> None:
    sdk = client(standin)
    tool = {"name": "Bash", "input": {"command": "grep -rn TODO src/ | head -50", "timeout": 30}}
    body = hello(tools=TOOLS)
    plain = await sdk.messages.create(**body, extra_headers=script(text="Let me look.", tool=tool))
    async with sdk.messages.stream(
        **body, extra_headers=script(text="Let me look.", tool=tool)
    ) as stream:
        streamed = await stream.get_final_message()
    for message in (plain, streamed):
        assert message.stop_reason == "tool_use"
        assert [b.type for b in message.content] == ["text", "tool_use"]
        call = message.content[1]
        assert call.type == "tool_use"
        assert call.name == "Bash" and call.input == tool["input"]
        assert call.id.startswith("toolu_")
    assert plain.content[1].id == streamed.content[1].id  # type: ignore[union-attr]


def test_sync_sdk_against_the_threaded_stand_in(standin_thread: RunningStandIn) -> None:
    with anthropic.Anthropic(api_key="test-key", base_url=standin_thread.url) as sdk:
        plain = sdk.messages.create(**hello())
        with sdk.messages.stream(**hello()) as stream:
            texts = list(stream.text_stream)
            streamed = stream.get_final_message()
    assert len(texts) > 1  # the text arrived in several deltas
    assert "".join(texts) == plain.content[0].text == streamed.content[0].text  # type: ignore[union-attr]
    assert [r.path_qs for r in standin_thread.recorded] == ["/v1/messages", "/v1/messages"]


async def test_thinking_round_trip_and_modification_is_refused(
    standin: RunningStandIn, client: MakeClient
) -> None:
    sdk = client(standin)
    body = hello(max_tokens=2000, tools=TOOLS, thinking={"type": "enabled", "budget_tokens": 1024})
    headers = script(thinking=True, tool={"name": "Bash", "input": {"command": "ls"}})
    async with sdk.messages.stream(**body, extra_headers=headers) as stream:
        first = await stream.get_final_message()
    assert [b.type for b in first.content] == ["thinking", "tool_use"]
    turn = [b.model_dump(exclude_none=True) for b in first.content]
    for block in turn:
        block.pop("caller", None)
    result = {"type": "tool_result", "tool_use_id": first.content[1].id, "content": "app.py"}  # type: ignore[union-attr]
    follow = {
        **body,
        "messages": [
            *body["messages"],
            {"role": "assistant", "content": turn},
            {"role": "user", "content": [result]},
        ],
    }
    assert (await sdk.messages.create(**follow)).stop_reason == "end_turn"
    turn[0]["thinking"] += " (edited)"
    with pytest.raises(anthropic.BadRequestError) as raised:
        await sdk.messages.create(**follow)
    assert "cannot be modified" in str(raised.value)


# -- raw HTTP: headers, errors, routes --------------------------------------------


async def test_raw_stream_has_the_api_event_sequence(standin: RunningStandIn) -> None:
    tool = {"name": "Bash", "input": {"command": "find . -name '*.py' -newer setup.cfg"}}
    status, headers, raw = await post(
        standin,
        hello(stream=True, tools=TOOLS),
        {**HEADERS, **script(text="Searching now.", tool=tool)},
    )
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    assert headers["request-id"].startswith("req_")
    events = sse_events(raw)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert set(start["usage"]) >= {
        "input_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    }
    json_pieces = [
        d["delta"]["partial_json"]
        for n, d in events
        if n == "content_block_delta" and d["index"] == 1
    ]
    assert len(json_pieces) > 2 and json_pieces[0] == ""
    assert json.loads("".join(json_pieces)) == tool["input"]
    assert [d["index"] for n, d in events if n == "content_block_start"] == [0, 1]
    assert [d["index"] for n, d in events if n == "content_block_stop"] == [0, 1]
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert delta["usage"]["output_tokens"] > 1


async def test_recorded_requests_keep_method_path_headers_and_bytes(
    standin: RunningStandIn,
) -> None:
    body = b'{"model": "m",  "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}'
    headers = {**HEADERS, "X-Claude-Code-Session-Id": "abc", "anthropic-beta": "a-1,b-2"}
    status, _, _ = await post(standin, body, headers, path="/v1/messages?beta=true")
    assert status == 200
    (record,) = standin.recorded
    assert (record.method, record.path_qs, record.body) == ("POST", "/v1/messages?beta=true", body)
    assert record.headers["X-Claude-Code-Session-Id"] == "abc"
    assert record.headers["anthropic-beta"] == "a-1,b-2"
    assert record.outcome == "complete"


async def test_missing_credential_is_401_and_bearer_is_accepted(standin: RunningStandIn) -> None:
    status, headers, raw = await post(standin, hello(), {"anthropic-version": "2023-06-01"})
    assert status == 401
    error = orjson.loads(raw)
    assert error["type"] == "error"
    assert error["error"]["type"] == "authentication_error"
    assert error["request_id"] == headers["request-id"]
    bearer = {"authorization": "Bearer token-1", "anthropic-version": "2023-06-01"}
    assert (await post(standin, hello(), bearer))[0] == 200


async def test_missing_version_header_is_400(standin: RunningStandIn) -> None:
    status, _, raw = await post(standin, hello(), {"x-api-key": "k"})
    assert status == 400
    assert orjson.loads(raw)["error"] == {
        "type": "invalid_request_error",
        "message": "anthropic-version: header is required",
    }


async def test_unknown_path_is_404_in_api_shape(standin: RunningStandIn) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(standin.url + "/v1/nothing", headers=HEADERS) as r,
    ):
        assert r.status == 404
        assert r.headers["request-id"].startswith("req_")
        body = await r.json()
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert standin.recorded[0].path_qs == "/v1/nothing"


async def test_invalid_requests_get_the_api_error(
    standin: RunningStandIn, client: MakeClient
) -> None:
    broken = hello(messages=[{"role": "user", "content": ""}])
    with pytest.raises(anthropic.BadRequestError) as raised:
        await client(standin).messages.create(**broken)
    assert raised.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"messages.0: {NON_EMPTY}",
        },
        "request_id": raised.value.response.headers["request-id"],
    }
    status, _, raw = await post(standin, b"{not json")
    assert status == 400 and orjson.loads(raw)["error"]["type"] == "invalid_request_error"
    status, _, raw = await post(standin, hello(), {**HEADERS, "x-stand-in": "{bad"})
    assert status == 400 and "x-stand-in" in orjson.loads(raw)["error"]["message"]


async def test_window_overflow_is_prompt_too_long(make_standin: Any) -> None:
    standin = await make_standin(StandInOptions(windows={"*": 200_000, "claude-small-*": 2_000}))
    body = hello(model="claude-small-1", system=LONG_SYSTEM)
    tokens = default_counter().count_request(body)
    status, _, raw = await post(standin, body)
    assert status == 400
    assert (
        orjson.loads(raw)["error"]["message"]
        == f"prompt is too long: {tokens} tokens > 2000 maximum"
    )
    assert (await post(standin, {**body, "model": MODEL}))[0] == 200


async def test_body_over_the_limit_is_413(make_standin: Any) -> None:
    standin = await make_standin(StandInOptions(max_body_bytes=10_000))
    status, _, raw = await post(standin, hello(system="x " * 10_000))
    assert status == 413
    assert orjson.loads(raw)["error"]["type"] == "request_too_large"


async def test_count_tokens_matches_the_project_counter(
    standin: RunningStandIn, client: MakeClient
) -> None:
    body = hello(system="You are terse.", tools=TOOLS)
    del body["max_tokens"]
    counted = await client(standin).messages.count_tokens(**body)
    assert counted.input_tokens == default_counter().count_request(body)
    status, _, raw = await post(
        standin, {"model": MODEL, "messages": []}, path="/v1/messages/count_tokens"
    )
    assert status == 400 and "at least one message" in orjson.loads(raw)["error"]["message"]


async def test_models_list_and_get(standin: RunningStandIn, client: MakeClient) -> None:
    sdk = client(standin)
    models = [m async for m in sdk.models.list()]
    assert len(models) >= 2 and all(m.type == "model" for m in models)
    assert (await sdk.models.retrieve(models[0].id)).id == models[0].id
    with pytest.raises(anthropic.NotFoundError):
        await sdk.models.retrieve("claude-nonexistent")


@pytest.mark.parametrize("path", AGENT_REQUESTS, ids=[p.name for p in AGENT_REQUESTS])
async def test_recorded_agent_requests_are_answered(standin: RunningStandIn, path: Path) -> None:
    recorded = json.loads(path.read_bytes())  # noqa: ASYNC240 (a small local fixture)
    headers = {
        k: v
        for k, v in recorded["headers"].items()
        if k.lower() not in ("connection", "accept-encoding")
    }
    status, _, raw = await post(
        standin, recorded["body"], {**headers, "x-api-key": "k"}, path=recorded["path"]
    )
    assert status == 200, raw[:300]
    names = [name for name, _ in sse_events(raw)]
    assert names[0] == "message_start" and names[-1] == "message_stop"


# -- prompt caching ---------------------------------------------------------------


async def test_prompt_cache_usage(standin: RunningStandIn, client: MakeClient) -> None:
    sdk = client(standin)
    system = [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}]
    body = hello(system=system)
    first = await sdk.messages.create(**body)
    second = await sdk.messages.create(**body)
    total = default_counter().count_request(body)
    assert first.usage.cache_creation_input_tokens > 1024
    assert first.usage.cache_read_input_tokens == 0
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.cache_creation_input_tokens == 0
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == total
    # Another credential has its own cache.
    other = client(standin, api_key="other-key")
    assert (await other.messages.create(**body)).usage.cache_read_input_tokens == 0
    # A changed prefix is written again.
    changed = hello(system=[{**system[0], "text": "Changed. " + LONG_SYSTEM}])
    async with sdk.messages.stream(**changed) as stream:
        third = await stream.get_final_message()
    assert third.usage.cache_read_input_tokens == 0
    assert third.usage.cache_creation_input_tokens > 1024


# -- faults -----------------------------------------------------------------------


async def test_429_once_then_the_sdk_retry_succeeds(
    standin: RunningStandIn, client: MakeClient
) -> None:
    headers = script(fault="429", fault_times=1, retry_after_ms=20)
    answer = await client(standin).messages.create(**hello(), extra_headers=headers)
    assert answer.stop_reason == "end_turn"
    assert len(standin.recorded) == 2


async def test_429_carries_retry_after(standin: RunningStandIn) -> None:
    status, headers, raw = await post(standin, hello(), {**HEADERS, **script(fault="429")})
    assert status == 429
    assert headers["retry-after"] == "1" and headers["retry-after-ms"] == "1000"
    assert orjson.loads(raw)["error"]["type"] == "rate_limit_error"


@pytest.mark.parametrize(
    ("fault", "error_class", "kind"),
    [
        ("529", anthropic.OverloadedError, "overloaded_error"),
        ("500", anthropic.InternalServerError, "api_error"),
    ],
)
async def test_server_errors(
    standin: RunningStandIn, fault: str, error_class: type, kind: str, client: MakeClient
) -> None:
    sdk = client(standin, max_retries=0)
    with pytest.raises(error_class) as raised:
        await sdk.messages.create(**hello(), extra_headers=script(fault=fault))
    assert raised.value.body["error"]["type"] == kind  # type: ignore[attr-defined]
    # With retries, two failures then a success.
    retried = client(standin, max_retries=2)
    headers = script(fault=fault, fault_times=3)  # one used above, two more now
    assert (
        await retried.messages.create(**hello(), extra_headers=headers)
    ).stop_reason == "end_turn"


async def test_stream_error_event_after_the_200(
    standin: RunningStandIn, client: MakeClient
) -> None:
    status, _, raw = await post(
        standin, hello(stream=True), {**HEADERS, **script(fault="stream_error")}
    )
    assert status == 200
    events = sse_events(raw)
    assert events[0][0] == "message_start"
    assert events[-1] == (
        "error",
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    )
    assert "message_stop" not in [name for name, _ in events]
    with pytest.raises(anthropic.APIStatusError):
        async with client(standin).messages.stream(
            **hello(), extra_headers=script(fault="stream_error")
        ) as s:
            await s.get_final_message()


async def test_eof_cuts_the_stream_before_message_stop(standin: RunningStandIn) -> None:
    received = b""
    async with aiohttp.ClientSession() as session:
        headers = {**HEADERS, **script(fault="eof")}
        async with session.post(
            standin.url + "/v1/messages", json=hello(stream=True), headers=headers
        ) as r:
            assert r.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                async for chunk in r.content.iter_any():
                    received += chunk
    names = [name for name, _ in sse_events(received)]
    assert names[0] == "message_start" and "content_block_delta" in names
    assert "message_stop" not in names
    assert standin.recorded[0].outcome == "cut"


async def test_eof_cuts_a_plain_body(standin: RunningStandIn) -> None:
    async with aiohttp.ClientSession() as session:
        headers = {**HEADERS, **script(fault="eof")}
        async with session.post(standin.url + "/v1/messages", json=hello(), headers=headers) as r:
            assert r.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()


async def test_stall_then_the_rest_of_the_stream(standin: RunningStandIn) -> None:
    status, _, raw = await post(
        standin, hello(stream=True), {**HEADERS, **script(fault="stall", stall_seconds=0.2)}
    )
    assert status == 200
    names = [name for name, _ in sse_events(raw)]
    assert names[0] == "message_start" and names[-1] == "message_stop"


async def test_stall_of_a_plain_answer(standin: RunningStandIn, client: MakeClient) -> None:
    headers = script(fault="stall", stall_seconds=0.2)
    answer = await client(standin).messages.create(**hello(), extra_headers=headers)
    assert answer.stop_reason == "end_turn"
    assert standin.recorded[0].outcome == "complete"


async def test_client_leaving_a_stall_is_recorded_as_cancelled(standin: RunningStandIn) -> None:
    async with aiohttp.ClientSession() as session:
        headers = {**HEADERS, **script(fault="stall", stall_seconds=60)}
        async with session.post(
            standin.url + "/v1/messages", json=hello(stream=True), headers=headers
        ) as r:
            line = await r.content.readline()
            assert line == b"event: message_start\n"
    for _ in range(200):  # the stand-in notices within its poll interval
        if standin.recorded[0].outcome != "open":
            break
        await asyncio.sleep(0.05)
    assert standin.recorded[0].outcome == "cancelled"
    assert standin.recorded[0].ended_at is not None


async def test_fault_times_counts_per_stand_in(standin: RunningStandIn, make_standin: Any) -> None:
    headers = {**HEADERS, **script(fault="529", fault_times=1)}
    assert (await post(standin, hello(), headers))[0] == 529
    assert (await post(standin, hello(), headers))[0] == 200
    fresh = await make_standin(StandInOptions(script={"fault": "529", "fault_times": 1}))
    assert (await post(fresh, hello()))[0] == 529
    assert (await post(fresh, hello()))[0] == 200


async def test_token_delay_streams_every_delta(standin: RunningStandIn) -> None:
    text = "one two three four five six"
    headers = {**HEADERS, **script(text=text, token_delay=0.01, chunk_tokens=1)}
    _, _, raw = await post(standin, hello(stream=True), headers)
    deltas = [d["delta"]["text"] for n, d in sse_events(raw) if n == "content_block_delta"]
    assert deltas == ["one ", "two ", "three ", "four ", "five ", "six"]


# -- read_result and summaries ----------------------------------------------------


async def test_read_result_script(standin: RunningStandIn, client: MakeClient) -> None:
    ref = "r_" + "0a1b2c3d4e5f6789"
    read_tool = {
        "name": "read_result",
        "description": "Read a stored result",
        "input_schema": {"type": "object"},
    }
    stub = f'[first 2000 of 90000 characters] Call read_result(ref="{ref}", start=..., length=...)'
    messages = [
        {"role": "user", "content": "Check the build log."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": stub}],
        },
    ]
    body = hello(messages=messages, tools=[*TOOLS, read_tool])
    sdk = client(standin)
    async with sdk.messages.stream(**body, extra_headers=script(read_result=True)) as stream:
        answer = await stream.get_final_message()
    assert answer.stop_reason == "tool_use"
    call = answer.content[0]
    assert call.type == "tool_use" and call.name == "read_result"
    assert call.input == {"ref": ref, "start": 0, "length": 2000}
    answered = [
        *messages,
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": call.id, "name": "read_result", "input": call.input}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "the rest"}],
        },
    ]
    after = await sdk.messages.create(
        **hello(messages=answered, tools=[*TOOLS, read_tool]),
        extra_headers=script(read_result=True),
    )
    assert after.stop_reason == "end_turn" and after.content[0].type == "text"


async def test_summary_purpose(standin: RunningStandIn, client: MakeClient) -> None:
    transcript = (
        "We changed proxy/server/relay.py: IDLE_TIMEOUT is now 300 and StreamRelay flushes."
    )
    body = {
        "model": MODEL,
        "max_tokens": 300,
        "system": "Summarise the conversation. Keep identifiers verbatim.",
        "messages": [{"role": "user", "content": transcript}],
    }
    headers = {"x-compaction-proxy-purpose": "summary"}
    sdk = client(standin)
    plain = await sdk.messages.create(**body, extra_headers=headers)
    async with sdk.messages.stream(**body, extra_headers=headers) as stream:
        streamed = await stream.get_final_message()
    text = plain.content[0].text  # type: ignore[union-attr]
    assert text == streamed.content[0].text  # type: ignore[union-attr]
    for name in ("proxy/server/relay.py", "IDLE_TIMEOUT", "300", "StreamRelay"):
        assert name in text
    assert plain.usage.output_tokens <= 300


async def test_recorded_requests_are_bounded(make_standin: Any) -> None:
    standin = await make_standin(StandInOptions(max_recorded=3))
    for n in range(5):
        await post(standin, hello(messages=[{"role": "user", "content": f"question {n}"}]))
    assert [orjson.loads(r.body)["messages"][0]["content"] for r in standin.recorded] == [
        "question 2",
        "question 3",
        "question 4",
    ]
