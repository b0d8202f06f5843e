"""POST and GET /v1/responses through the proxy: what a Responses client (the openai SDK,
Codex, raw HTTP) sees, with the stand-in or a raw upstream behind."""

from __future__ import annotations

import asyncio
import gzip
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from proxy.server.app import RunningProxy
from proxy.testing.agent import tool_output
from proxy.testing.agent_responses import INSTRUCTIONS, TOOLS
from proxy.testing.api_responses import ResponsesOptions
from proxy.testing.standin import RecordedRequest, StandInOptions
from proxy.wire.responses_compaction import MISSING_NOTE, SUMMARY_HEADER
from proxy.wire.responses_units import text_message as message
from tests.plugins.responses import MakeResponsesStandIn
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import SMALL_WINDOW, MakeProxy
from tests.server.rawupstream import RawUpstream
from tests.server.test_metrics import scrape, value

PATH = "/v1/responses"
AUTH = {"Authorization": "Bearer sk-responses-test"}


def turn_items(turns: int, chars: int = 8_000) -> list[dict[str, Any]]:
    """A Codex-shaped history: instructions, task, then calls and their large outputs."""
    items = [message("developer", INSTRUCTIONS), message("user", "Fix the build.")]
    for t in range(turns):
        call = {
            "type": "function_call",
            "call_id": f"call_{t}",
            "name": "exec_command",
            "arguments": orjson.dumps({"cmd": f"make step-{t}"}).decode(),
        }
        output = {"type": "function_call_output", "call_id": f"call_{t}", "output": ""}
        items += [call, {**output, "output": tool_output(t, chars)}]
    return items


def body(items: list[Any], **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-test", "input": items, "tools": TOOLS, "store": False, **extra}


def posts(standin: RunningStandIn) -> list[RecordedRequest]:
    return [r for r in standin.recorded if r.method == "POST" and r.path_qs == PATH]


async def post(
    proxy: RunningProxy, payload: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            proxy.url + PATH, data=orjson.dumps(payload), headers={**AUTH, **(headers or {})}
        ) as r,
    ):
        return r.status, dict(r.headers), await r.read()


def events(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(block.split(b"\ndata: ", 1)[1]) for block in raw.strip().split(b"\n\n")]


async def standin_with(make: MakeResponsesStandIn, **responses: Any) -> RunningStandIn:
    return await make(
        StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None),
        ResponsesOptions(**responses),
    )


async def proxy_for(make: MakeProxy, upstream: str, **settings: Any) -> RunningProxy:
    return await make("http://127.0.0.1:9", **{"upstream.openai_url": upstream, **settings})


# -- the request path -------------------------------------------------------------------


async def test_a_request_that_fits_goes_upstream_as_its_bytes(
    make_responses_standin: MakeResponsesStandIn, make_compacting_proxy: MakeProxy
) -> None:
    standin = await standin_with(make_responses_standin)
    proxy = await proxy_for(make_compacting_proxy, standin.url)
    raw = orjson.dumps(body(turn_items(2, 500), stream=True))
    async with (
        aiohttp.ClientSession() as session,
        session.post(proxy.url + PATH, data=raw, headers=AUTH) as r,
    ):
        assert r.status == 200 and not any(h.startswith("x-compaction") for h in r.headers)
        await r.read()
    assert posts(standin)[-1].body == raw


async def test_the_proxys_own_errors_are_in_openais_shape(
    make_responses_standin: MakeResponsesStandIn, make_compacting_proxy: MakeProxy
) -> None:
    standin = await standin_with(make_responses_standin)
    proxy = await proxy_for(make_compacting_proxy, standin.url)
    async with (
        aiohttp.ClientSession() as session,
        session.post(proxy.url + PATH, data=b"{not json", headers=AUTH) as r,
    ):
        assert r.status == 400
        error = (await r.json())["error"]
        assert error["type"] == "invalid_request_error" and set(error) == {
            "message",
            "type",
            "param",
            "code",
        }
    # What cannot be dropped (the instructions, the task) is over the window: refused
    # before the stream starts, as the API does without a stream.
    huge = [message("developer", "rule " * 40_000), message("user", "go")]
    status, _, raw = await post(proxy, body(huge, stream=True))
    assert status == 400
    assert orjson.loads(raw)["error"]["code"] == "context_length_exceeded"
    assert posts(standin) == []


async def test_a_websocket_the_upstream_refuses_gets_426_and_other_gets_pass_through(
    make_responses_standin: MakeResponsesStandIn, make_compacting_proxy: MakeProxy
) -> None:
    standin = await standin_with(make_responses_standin)
    proxy = await proxy_for(make_compacting_proxy, standin.url)
    upgrade = {**AUTH, "Connection": "Upgrade", "Upgrade": "websocket"}
    async with aiohttp.ClientSession() as session:
        async with session.get(proxy.url + PATH, headers=upgrade) as r:
            assert r.status == 426
            assert (await r.json())["error"]["code"] == "websocket_not_supported"
        async with session.get(proxy.url + PATH, headers=AUTH) as r:
            assert r.status == 404  # the stand-in's own answer to a plain GET
    # The upgrade was tried upstream (refused there: 426), the plain GET passed through.
    upgrades = [r.headers.get("Upgrade", "") for r in standin.recorded]
    assert [u.lower() for u in upgrades] == ["websocket", ""]


async def test_a_client_that_closes_after_response_completed_counts_as_complete(
    make_compacting_proxy: MakeProxy,
) -> None:
    completed = {
        "type": "response.completed",
        "sequence_number": 1,
        "response": {
            "id": "resp_1",
            "status": "completed",
            "output": [],
            "usage": {"input_tokens": 5, "output_tokens": 1, "total_tokens": 6},
        },
    }
    upstream = await RawUpstream().start()
    try:
        upstream.scripts[PATH] = [
            b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n',
            b"event: response.completed\ndata: " + orjson.dumps(completed) + b"\n\n",
            30.0,  # the upstream is slow to close its stream; the client is not
        ]
        proxy = await proxy_for(make_compacting_proxy, upstream.url)
        async with aiohttp.ClientSession() as session:
            response = await session.post(
                proxy.url + PATH, data=orjson.dumps(body([message("user", "hi")], stream=True))
            )
            seen = b""
            while b"response.completed" not in seen:
                seen += await response.content.readany()
            response.close()  # as Codex does once it has response.completed
        await asyncio.wait_for(upstream.closed[PATH].wait(), 10)
    finally:
        await upstream.stop()
    samples = await scrape(proxy)
    name = "compaction_proxy_requests_total"
    assert value(samples, name, route=PATH, status="200") == 1
    assert value(samples, name, route=PATH, status="499") == 0


# -- read_result ------------------------------------------------------------------------


async def test_the_sdk_never_sees_read_result_streamed_or_whole(
    make_responses_standin: MakeResponsesStandIn, make_compacting_proxy: MakeProxy
) -> None:
    standin = await standin_with(make_responses_standin)
    proxy = await proxy_for(make_compacting_proxy, standin.url)
    read = {"x-stand-in": orjson.dumps({"read_result": True, "text": "Done reading."}).decode()}
    request = body(turn_items(8), reasoning={"effort": "low"})
    async with openai.AsyncOpenAI(
        base_url=proxy.url + "/v1", api_key="sk-responses-test", max_retries=0
    ) as client:
        whole = await client.responses.with_raw_response.create(**request, extra_headers=read)
        assert whole.headers["x-compaction-read-rounds"] == "1"
        response = whole.parse()
        streamed = [
            e
            async for e in await client.responses.create(**request, stream=True, extra_headers=read)
        ]
    final = streamed[-1].response
    for answer in (response, final):
        assert [i.type for i in answer.output] == ["reasoning", "message", "reasoning", "message"]
        assert answer.output_text == "Done reading.Done reading."
    assert [e.sequence_number for e in streamed] == list(range(len(streamed)))
    rounds = [orjson.loads(r.body) for r in posts(standin)]
    assert [i["name"] for i in rounds[1]["input"] if i.get("type") == "function_call"][-1] == (
        "read_result"
    )
    assert rounds[1]["tools"][-1]["name"] == "read_result"


async def test_a_read_next_to_a_client_call_is_hidden(make_compacting_proxy: MakeProxy) -> None:
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": "e"}
    read = {
        "id": "fc_1",
        "type": "function_call",
        "call_id": "call_read",
        "name": "read_result",
        "arguments": '{"ref": "r_0000000000000000"}',
    }
    client_call = {**read, "id": "fc_2", "call_id": "call_ls", "name": "exec_command"}
    client_call["arguments"] = '{"cmd": "ls"}'
    stream = []
    for n, item in enumerate([reasoning, read, client_call]):
        for kind in ("response.output_item.added", "response.output_item.done"):
            data = {"type": kind, "sequence_number": 0, "output_index": n, "item": item}
            stream.append(data)
    final = {"id": "resp_9", "status": "completed", "output": [reasoning, read, client_call]}
    final["usage"] = {"input_tokens": 900, "output_tokens": 30, "total_tokens": 930}
    stream.append({"type": "response.completed", "response": final})
    stream.insert(0, {"type": "response.created", "response": {**final, "output": []}})
    for n, data in enumerate(stream):
        data["sequence_number"] = n
    upstream = await RawUpstream().start()
    try:
        upstream.scripts[PATH] = [
            b"event: " + d["type"].encode() + b"\ndata: " + orjson.dumps(d) + b"\n\n"
            for d in stream
        ]
        proxy = await proxy_for(make_compacting_proxy, upstream.url)
        status, headers, raw = await post(proxy, body(turn_items(8), stream=True))
    finally:
        await upstream.stop()
    assert status == 200 and headers["x-compaction-strategy"].startswith("offload")
    seen = events(raw)
    assert b"read_result" not in raw
    completed = seen[-1]["response"]
    assert [i["id"] for i in completed["output"]] == ["rs_1", "fc_2"]
    assert [d["sequence_number"] for d in seen] == list(range(len(seen)))
    assert [d["output_index"] for d in seen if "output_index" in d] == [0, 0, 1, 1]


# -- Codex's compaction -----------------------------------------------------------------

TRIGGER = {"type": "compaction_trigger"}


def compaction_request(**extra: Any) -> dict[str, Any]:
    return body([*turn_items(3, 3_000), TRIGGER], prompt_cache_key="thread-7", **extra)


def restart(item: dict[str, Any]) -> dict[str, Any]:
    """The request Codex sends after compacting: the start, then the compaction item."""
    items = [message("developer", INSTRUCTIONS), message("user", "Fix the build."), item]
    return body(items, prompt_cache_key="thread-7")


def summaries(standin: RunningStandIn) -> list[RecordedRequest]:
    return [r for r in posts(standin) if r.headers.get("x-compaction-proxy-purpose") == "summary"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_served_compaction_is_a_sealed_item_that_comes_back_as_its_summary(
    make_responses_standin: MakeResponsesStandIn, make_compacting_proxy: MakeProxy, stream: bool
) -> None:
    standin = await standin_with(make_responses_standin, plays_openai=False)
    proxy = await proxy_for(
        make_compacting_proxy, standin.url, **{"responses.codex_compaction": "serve"}
    )
    status, headers, raw = await post(proxy, compaction_request(stream=stream))
    assert status == 200 and headers["x-compaction-codex-compaction"] == "served"
    if stream:
        seen = events(raw)
        assert [e["type"] for e in seen] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.compaction.compacting",
            "response.output_item.done",
            "response.completed",
        ]
        response = seen[-1]["response"]
    else:
        response = orjson.loads(raw)
    [item] = response["output"]
    assert item["type"] == "compaction" and item["encrypted_content"].startswith("cpx1.")
    assert response["usage"]["output_tokens"] > 0
    # Nothing but the summariser's call went upstream: no compaction_trigger. It was made
    # in place: the conversation's own request (its prefix cached), then the proxy's ask.
    assert len(posts(standin)) == len(summaries(standin)) == 1
    asked = orjson.loads(summaries(standin)[0].body)
    history = compaction_request()["input"][:-1]
    assert asked["tools"] == TOOLS and asked["input"][: len(history)] == history
    assert asked["input"][-1]["content"][0]["text"].startswith("[compaction-proxy] This")

    status, _, _ = await post(proxy, restart(item))
    assert status == 200
    sent = orjson.loads(posts(standin)[-1].body)["input"]
    assert sent[-1]["type"] == "message" and sent[-1]["role"] == "user"
    text = sent[-1]["content"][0]["text"]
    assert text.startswith(SUMMARY_HEADER) and "call_0" in text

    # Another tenant, or a changed item: the same note, never the summary.
    for key, content in (
        ("sk-someone-else", item["encrypted_content"]),
        (None, item["encrypted_content"][:-4] + "0000"),
    ):
        changed = restart({**item, "encrypted_content": content})
        auth = {"Authorization": f"Bearer {key}"} if key else None
        status, _, _ = await post(proxy, changed, auth)
        assert status == 200
        sent = orjson.loads(posts(standin)[-1].body)["input"]
        assert sent[-1]["content"][0]["text"] == MISSING_NOTE


async def test_auto_serves_once_the_upstream_refuses_a_trigger(
    make_responses_standin: MakeResponsesStandIn, make_compacting_proxy: MakeProxy
) -> None:
    standin = await standin_with(make_responses_standin, plays_openai=False)
    proxy = await proxy_for(make_compacting_proxy, standin.url)  # codex_compaction = "auto"
    for _ in range(2):
        status, headers, raw = await post(proxy, compaction_request(stream=True))
        assert status == 200 and headers["x-compaction-codex-compaction"] == "served"
        assert events(raw)[-1]["response"]["output"][0]["type"] == "compaction"
    turns = [r for r in posts(standin) if r not in summaries(standin)]
    assert len(turns) == 1, "only the first trigger went upstream (and was refused)"
    assert orjson.loads(turns[0].body)["input"][-1] == TRIGGER


async def test_auto_passes_a_trigger_through_to_an_upstream_that_knows_it(
    make_responses_standin: MakeResponsesStandIn, make_compacting_proxy: MakeProxy
) -> None:
    standin = await standin_with(make_responses_standin, plays_openai=True)
    proxy = await proxy_for(make_compacting_proxy, standin.url)
    request = body([*turn_items(8), TRIGGER], stream=True)  # over the trigger: compacted
    status, headers, raw = await post(proxy, request)
    assert status == 200 and "x-compaction-codex-compaction" not in headers
    assert headers["x-compaction-strategy"] != ""
    [sent] = [orjson.loads(r.body) for r in posts(standin)]
    assert sent["input"][-1] == TRIGGER
    assert sent["tools"] == TOOLS, "no read_result for a compaction request"
    assert b"read_result" not in posts(standin)[0].body, "nor a stub naming it"
    [item] = events(raw)[-1]["response"]["output"]
    assert item["type"] == "compaction" and item["encrypted_content"].startswith("sti1.")


@pytest.mark.parametrize("ask", ["trigger", "no_tools"])
async def test_a_request_for_a_summary_is_compacted_without_a_stub_naming_read_result(
    make_responses_standin: MakeResponsesStandIn, make_compacting_proxy: MakeProxy, ask: str
) -> None:
    """A request whose answer is a summary (Codex's compaction_trigger passed through, or
    `tools: []`) is not offered read_result: the planner knows it before it writes any
    stub, so no stub names a tool the model does not have, even in a conversation whose
    earlier turn was offloaded (its history is folded or packed instead)."""
    standin = await standin_with(make_responses_standin, plays_openai=True)
    proxy = await proxy_for(make_compacting_proxy, standin.url)
    # An ordinary turn over the trigger: offloaded, its stubs naming read_result.
    status, headers, _ = await post(proxy, body(turn_items(8)))
    assert status == 200 and headers["x-compaction-strategy"].startswith("offload")
    assert b"read_result" in posts(standin)[-1].body
    items = [*turn_items(8), TRIGGER] if ask == "trigger" else turn_items(8)
    request = body(items, tools=[]) if ask == "no_tools" else body(items)
    status, headers, raw = await post(proxy, request)
    assert status == 200, raw
    assert headers["x-compaction-strategy"] != ""  # over the trigger: compacted
    sent = posts(standin)[-1]
    assert b"read_result" not in sent.body
    assert orjson.loads(sent.body)["tools"] == request["tools"]
    assert b"read_result" not in raw


async def test_a_sealed_item_opens_on_every_replica_of_the_fleet(
    make_responses_standin: MakeResponsesStandIn, make_compacting_proxy: MakeProxy
) -> None:
    standin = await standin_with(make_responses_standin, plays_openai=False)
    serve = {"responses.codex_compaction": "serve"}
    one = await proxy_for(make_compacting_proxy, standin.url, **serve)
    two = await proxy_for(make_compacting_proxy, standin.url, **serve)
    _, _, raw = await post(one, compaction_request())
    [item] = orjson.loads(raw)["output"]
    status, _, _ = await post(two, restart(item))
    assert status == 200
    text = orjson.loads(posts(standin)[-1].body)["input"][-1]["content"][0]["text"]
    assert text.startswith(SUMMARY_HEADER)


async def test_without_its_store_the_proxy_cannot_serve_but_never_forwards_a_sealed_item(
    make_responses_standin: MakeResponsesStandIn,
    make_compacting_proxy: MakeProxy,
) -> None:
    standin = await standin_with(make_responses_standin, plays_openai=False)
    serving = await proxy_for(
        make_compacting_proxy, standin.url, **{"responses.codex_compaction": "serve"}
    )
    _, _, raw = await post(serving, compaction_request())
    [item] = orjson.loads(raw)["output"]
    down = await proxy_for(
        make_compacting_proxy,
        standin.url,
        redis="redis://127.0.0.1:1",
        **{"responses.codex_compaction": "serve", "store.op_timeout": 0.2},
    )
    status, headers, raw = await post(down, compaction_request(stream=True))
    assert status == 503 and headers["x-should-retry"] == "true"
    assert orjson.loads(raw)["error"]["type"] == "server_error"
    status, _, _ = await post(down, restart(item))
    assert status == 200
    sent = orjson.loads(posts(standin)[-1].body)["input"]
    assert sent[-1]["content"][0]["text"] == MISSING_NOTE


async def test_a_compressed_request_with_a_sealed_item_goes_up_as_plain_json(
    make_responses_standin: MakeResponsesStandIn, make_compacting_proxy: MakeProxy
) -> None:
    standin = await standin_with(make_responses_standin, plays_openai=False)
    proxy = await proxy_for(
        make_compacting_proxy, standin.url, **{"responses.codex_compaction": "serve"}
    )
    _, _, raw = await post(proxy, compaction_request())
    [item] = orjson.loads(raw)["output"]
    packed = gzip.compress(orjson.dumps(restart(item)))
    headers = {**AUTH, "Content-Encoding": "gzip", "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(proxy.url + PATH, data=packed, headers=headers) as r,
    ):
        assert r.status == 200, await r.text()
        await r.read()
    sent = posts(standin)[-1]
    assert "Content-Encoding" not in sent.headers
    text = orjson.loads(sent.body)["input"][-1]["content"][0]["text"]
    assert text.startswith(SUMMARY_HEADER)
