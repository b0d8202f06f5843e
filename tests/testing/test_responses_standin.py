"""The stand-in's Responses route over HTTP: the real openai SDK, and raw SSE where the
SDK would hide what is on the wire."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from proxy.testing.api_responses import ResponsesOptions
from proxy.testing.responses_items import unseal
from proxy.testing.standin import StandInOptions
from tests.plugins.responses import MakeResponsesStandIn
from tests.plugins.standin import RunningStandIn

EXEC = {
    "type": "function",
    "name": "exec_command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}
PATCH = {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}}
READ = {"type": "function", "name": "read_result", "parameters": {"type": "object"}}
KEY = ResponsesOptions().seal_key
AUTH = {"authorization": "Bearer sk-responses"}


def script(**keys: Any) -> dict[str, str]:
    return {"x-stand-in": orjson.dumps(keys).decode()}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def request(items: list[Any], **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-test", "input": items, "tools": [EXEC, PATCH], **extra}


async def standin_with(
    make: MakeResponsesStandIn, window: int = 200_000, **responses: Any
) -> RunningStandIn:
    return await make(StandInOptions(windows={"*": window}), ResponsesOptions(**responses))


@pytest.fixture
async def standin(make_responses_standin: MakeResponsesStandIn) -> RunningStandIn:
    return await standin_with(make_responses_standin)


@pytest.fixture
async def client(standin: RunningStandIn) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=standin.url + "/v1", api_key="sk-responses", max_retries=0
    ) as sdk:
        yield sdk


async def sse(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    """(status, [(event name, data)]) of a raw POST /v1/responses."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/responses", json=body, headers={**AUTH, **(headers or {})}) as r,
    ):
        text = await r.text()
        if r.status != 200 or not r.content_type.startswith("text/event-stream"):
            return r.status, orjson.loads(text)
        events = []
        for block in text.strip().split("\n\n"):
            name, data = block.split("\n", 1)
            events.append((name.removeprefix("event: "), orjson.loads(data.removeprefix("data: "))))
        return r.status, events


async def test_a_streamed_call_is_the_apis_event_sequence(standin: RunningStandIn) -> None:
    body = request(
        [user("list the files")],
        stream=True,
        reasoning={"effort": "low"},
        include=["reasoning.encrypted_content"],
    )
    status, events = await sse(
        standin.url,
        body,
        script(text="Listing.", tool={"name": "exec_command", "input": {"cmd": "ls"}}),
    )
    assert status == 200
    names = [name for name, _ in events]
    assert [data["type"] for _, data in events] == names
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] == "response.completed"
    final = events[-1][1]["response"]
    kinds = [item["type"] for item in final["output"]]
    assert kinds == ["reasoning", "message", "function_call"]
    added = [d for n, d in events if n == "response.output_item.added"]
    done = [d for n, d in events if n == "response.output_item.done"]
    assert [d["output_index"] for d in added] == [d["output_index"] for d in done] == [0, 1, 2]
    assert [d["item"] for d in done] == final["output"]
    assert "encrypted_content" not in added[0]["item"]
    assert unseal(done[0]["item"]["encrypted_content"], KEY) is not None
    text = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    assert text == "Listing."
    arguments = "".join(
        d["delta"] for n, d in events if n == "response.function_call_arguments.delta"
    )
    assert orjson.loads(arguments) == {"cmd": "ls"} == orjson.loads(final["output"][2]["arguments"])
    usage = final["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["output_tokens_details"]["reasoning_tokens"] > 0


async def test_the_sdk_reads_stream_and_json_alike_and_the_cache_hits(
    client: openai.AsyncOpenAI,
) -> None:
    long = "Follow the repository rules. " * 400  # over the cache's minimum
    items = [{"role": "developer", "content": long}, user("custom patch please")]
    headers = script(tool={"name": "apply_patch", "input": {"input": "*** Begin Patch\n"}})
    first = await client.responses.create(
        **request(items),
        extra_headers=headers,  # type: ignore[arg-type]
    )
    call = first.output[-1]
    assert call.type == "custom_tool_call" and call.input == "*** Begin Patch\n"
    assert first.usage is not None and first.usage.input_tokens_details.cached_tokens == 0
    answered = {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done!"}
    followed = [*items, call.model_dump(), answered]
    async with client.responses.stream(**request(followed)) as stream:  # type: ignore[arg-type]
        seen = [event.type async for event in stream]
        streamed = await stream.get_final_response()
    again = await client.responses.create(**request(followed))  # type: ignore[arg-type]
    assert seen[0] == "response.created" and seen[-1] == "response.completed"
    assert streamed.id == again.id and streamed.output_text == again.output_text
    assert [o.id for o in streamed.output] == [o.id for o in again.output]
    assert streamed.usage is not None and again.usage is not None
    assert 0 < streamed.usage.input_tokens_details.cached_tokens < streamed.usage.input_tokens
    assert again.usage.input_tokens_details.cached_tokens == again.usage.input_tokens


async def test_bad_requests_get_openais_error_shape(client: openai.AsyncOpenAI) -> None:
    orphan = request([user("go"), {"type": "function_call_output", "call_id": "c7", "output": "x"}])
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(**orphan)  # type: ignore[arg-type]
    assert caught.value.body == {
        "message": "No tool call found for function call output with call_id c7.",
        "type": "invalid_request_error",
        "param": "input",
        "code": None,
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{client.base_url}responses", json={"model": "m", "input": "hi"}) as r,
    ):
        assert r.status == 401
        assert (await r.json())["error"]["type"] == "invalid_request_error"


async def test_a_window_exceeded_is_reported_as_the_api_does(
    make_responses_standin: MakeResponsesStandIn,
) -> None:
    wording = "Your input exceeds the context window of this model."
    big = request([user("word " * 3000)])
    streamed = await standin_with(make_responses_standin, window=1000)
    status, events = await sse(streamed.url, {**big, "stream": True})
    assert status == 200
    assert [n for n, _ in events] == [
        "response.created", "response.in_progress", "error", "response.failed"
    ]  # fmt: skip
    assert events[2][1]["code"] == "context_length_exceeded" and wording in events[2][1]["message"]
    assert events[3][1]["response"]["error"]["code"] == "context_length_exceeded"
    status, error = await sse(streamed.url, big)
    assert status == 400 and error["error"]["code"] == "context_length_exceeded"
    refusing = await standin_with(make_responses_standin, window=1000, overflow="status")
    status, error = await sse(refusing.url, {**big, "stream": True})
    assert status == 400 and error["error"]["param"] == "input"


async def test_compaction_trigger_is_served_only_when_playing_openai(
    make_responses_standin: MakeResponsesStandIn,
) -> None:
    history = [
        user("print big.log"),
        {"type": "function_call", "call_id": "c1", "name": "exec_command",
         "arguments": '{"cmd": "sed -n 1,9p big.log"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "line 1 status=500\n" * 400},
    ]  # fmt: skip
    trigger = request([*history, {"type": "compaction_trigger"}], stream=True)
    other = await standin_with(make_responses_standin)
    status, error = await sse(other.url, trigger)
    assert status == 400 and error["error"]["param"] == "input[3].type"

    openai_like = await standin_with(make_responses_standin, plays_openai=True)
    status, events = await sse(openai_like.url, trigger)
    assert status == 200
    [item] = events[-1][1]["response"]["output"]
    assert item["type"] == "compaction"
    assert "response.compaction.compacting" in [n for n, _ in events]
    sealed = unseal(item["encrypted_content"], KEY)
    assert sealed is not None and "big.log" in sealed["text"]

    after = request([user("print big.log"), item, user("go on")])
    status, events = await sse(openai_like.url, {**after, "stream": True})
    history_tokens = (await sse(openai_like.url, request(history)))[1]["usage"]["input_tokens"]
    assert status == 200
    assert events[-1][1]["response"]["usage"]["input_tokens"] < history_tokens
    tampered = {**item, "encrypted_content": item["encrypted_content"][:-4] + "0000"}
    status, error = await sse(openai_like.url, request([tampered, user("go on")]))
    assert status == 400
    assert error["error"]["message"] == (
        f"The encrypted content for item {item['id']} could not be verified."
    )


async def test_a_handoff_summary_request_gets_a_summary(standin: RunningStandIn) -> None:
    asks = "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary."
    items = [
        user("fix src/build/pipeline.py"),
        {"type": "function_call", "call_id": "c1", "name": "exec_command",
         "arguments": '{"cmd": "pytest tests/test_pipeline.py"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "FAILED test_merge_42"},
        user(asks),
    ]  # fmt: skip
    status, response = await sse(standin.url, {"model": "gpt-test", "input": items, "tools": []})
    assert status == 200
    [message] = response["output"]
    text = message["content"][0]["text"]
    for identifier in ("src/build/pipeline.py", "tests/test_pipeline.py", "test_merge_42"):
        assert identifier in text


async def test_read_result_is_called_for_an_unread_stub(standin: RunningStandIn) -> None:
    stub = 'Offloaded. read_result(ref="r_0123456789abcdef", start=0, length=2000)'
    items = [
        user("go"),
        {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": stub},
    ]
    body = {"model": "gpt-test", "input": items, "tools": [EXEC, READ]}
    status, response = await sse(standin.url, body, script(read_result=True))
    assert status == 200
    call = response["output"][-1]
    assert call["name"] == "read_result"
    assert orjson.loads(call["arguments"])["ref"] == "r_0123456789abcdef"


async def test_websocket_upgrades_are_refused(
    make_responses_standin: MakeResponsesStandIn,
) -> None:
    nonce = "c3RhbmQtaW4gd2Vic29jaw=="
    upgrade = {**AUTH, "Upgrade": "websocket", "Connection": "Upgrade",
               "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": nonce}  # fmt: skip
    for option, status in ((426, 426), (404, 404)):
        standin = await standin_with(make_responses_standin, websocket_status=option)
        async with (
            aiohttp.ClientSession() as session,
            session.get(standin.url + "/v1/responses", headers=upgrade) as r,
        ):
            assert r.status == status
            assert (await r.json())["error"]["type"] == "invalid_request_error"
        async with (
            aiohttp.ClientSession() as session,
            session.get(standin.url + "/v1/responses", headers=AUTH) as r,
        ):
            assert r.status == 404


async def test_faults_and_turn_state(standin: RunningStandIn) -> None:
    status, error = await sse(standin.url, request([user("hi")]), script(fault="429"))
    assert status == 429 and error["error"]["code"] == "rate_limit_exceeded"
    status, events = await sse(
        standin.url, request([user("hi")], stream=True), script(fault="stream_error")
    )
    assert status == 200 and events[-1][0] == "error"
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    metadata = orjson.dumps({"turn_id": "t-1", "request_kind": "turn"}).decode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            standin.url + "/v1/responses",
            json=request([user("hi")]),
            headers={**AUTH, "x-codex-turn-metadata": metadata},
        ) as r,
    ):
        assert r.status == 200 and r.headers["x-codex-turn-state"].startswith("sts_")


@pytest.fixture
def codex_requests(fixtures_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    paths = sorted(fixtures_dir.glob("agent-requests/codex-*.json"))
    return [(path.name, orjson.loads(path.read_bytes())) for path in paths]


async def test_the_real_codex_requests_are_served(
    make_responses_standin: MakeResponsesStandIn, codex_requests: list[tuple[str, Any]]
) -> None:
    standin = await standin_with(make_responses_standin, plays_openai=True)
    assert len(codex_requests) == 6
    for name, recorded in codex_requests:
        status, events = await sse(standin.url, recorded["body"])
        assert status == 200, (name, events)
        assert events[-1][0] == "response.completed", name
