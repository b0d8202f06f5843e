"""/v1/responses over WebSocket through the proxy, against the stand-in's WebSocket: a
Codex-shaped client (aiohttp's WebSocket client) that prewarms, then sends each turn as
a `response.create` with previous_response_id and only its new items."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from proxy.core.tokens import default_counter
from proxy.server.app import RunningProxy, start
from proxy.server.lifecycle import LIFECYCLE
from proxy.server.logs import REQUEST_LOGGER
from proxy.store.accounts import Accounts, Scope
from proxy.testing.agent import tool_output
from proxy.testing.agent_responses import INSTRUCTIONS, TOOLS
from proxy.testing.api_responses import ResponsesOptions
from proxy.testing.responses_items import ItemCounter
from proxy.testing.standin import RecordedRequest, StandInOptions
from proxy.wire.responses_units import input_items
from proxy.wire.responses_units import text_message as message
from tests.plugins.responses import MakeResponsesStandIn
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import SMALL_WINDOW, SMALL_WINDOW_POLICY, MakeProxy, proxy_settings
from tests.server.test_keys_and_budgets import ENV, UPSTREAM_SECRET, new_key, settled
from tests.server.test_metrics import scrape, value

PATH = "/v1/responses"
PURPOSE = "x-compaction-proxy-purpose"
BETA = {"OpenAI-Beta": "responses_websockets=2026-02-06"}
AUTH = {"Authorization": "Bearer sk-responses-ws"}
EXEC = {"name": "exec_command", "input": {"cmd": "make"}}
KEY = ResponsesOptions().seal_key


def stand_in(**keys: Any) -> dict[str, str]:
    return {"x-stand-in": orjson.dumps(keys).decode()}


def create(items: list[Any], previous: str | None = None, **extra: Any) -> str:
    frame: dict[str, Any] = {"type": "response.create", "model": "gpt-test", "input": items}
    frame |= {"tools": TOOLS, "store": False, "stream": True, **extra}
    if previous is not None:
        frame["previous_response_id"] = previous
    return orjson.dumps(frame).decode()


async def until_done(ws: aiohttp.ClientWebSocketResponse) -> list[dict[str, Any]]:
    events = []
    while True:
        message_ = await ws.receive(timeout=20)
        assert message_.type == aiohttp.WSMsgType.TEXT, message_
        event = orjson.loads(message_.data)
        events.append(event)
        if event["type"] in ("response.completed", "response.incomplete", "response.failed"):
            return events
        if event["type"] == "error" and "status" in event:
            return events


def frames(standin: RunningStandIn) -> list[RecordedRequest]:
    return [r for r in standin.recorded if r.transport == "websocket"]


def tokens(record: RecordedRequest) -> int:
    return ItemCounter(default_counter(), KEY).count_request(orjson.loads(record.resolved))


async def standin_with(make: MakeResponsesStandIn, **responses: Any) -> RunningStandIn:
    return await make(
        StandInOptions(windows={"*": SMALL_WINDOW}, max_recorded=None),
        ResponsesOptions(**{"websocket_status": 101, **responses}),
    )


async def proxy_for(make: MakeProxy, upstream: str, **settings: Any) -> RunningProxy:
    return await make("http://127.0.0.1:9", **{"upstream.openai_url": upstream, **settings})


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def agent(
    ws: aiohttp.ClientWebSocketResponse, turns: int, chars: int, sent: list[str] | None = None
) -> list[list[dict[str, Any]]]:
    """Prewarm, then `turns` tool turns, each answered with a large output (the frames
    sent noted in `sent`)."""
    sent = [] if sent is None else sent
    first = [message("developer", INSTRUCTIONS), message("user", "Fix the build.")]
    sent.append(create(first, generate=False))
    await ws.send_str(sent[-1])
    answers = [await until_done(ws)]
    previous = answers[-1][-1]["response"]["id"]
    new: list[Any] = []
    for t in range(turns):
        sent.append(create(new, previous))
        await ws.send_str(sent[-1])
        events = await until_done(ws)
        answers.append(events)
        end = events[-1]
        assert end["type"] == "response.completed", end
        previous = end["response"]["id"]
        calls = [i for i in end["response"]["output"] if i["type"] == "function_call"]
        new = [
            {
                "type": "function_call_output",
                "call_id": c["call_id"],
                "output": tool_output(t, chars),
            }
            for c in calls
        ]
    return answers


async def test_a_session_relayed_untouched_goes_incrementally(
    make_responses_standin: MakeResponsesStandIn, make_compacting_proxy: MakeProxy, session: Any
) -> None:
    standin = await standin_with(make_responses_standin)
    proxy = await proxy_for(make_compacting_proxy, standin.url)
    metadata = {"x-codex-turn-metadata": orjson.dumps({"turn_id": "t1"}).decode()}
    headers = {**AUTH, **BETA, **stand_in(tool=EXEC), **metadata}
    async with session.ws_connect(proxy.url + PATH, headers=headers, compress=15) as ws:
        assert ws.compress  # permessage-deflate, end to end
        turn_state = ws._response.headers.get("x-codex-turn-state", "")  # the 101's headers
        assert turn_state.startswith("sts_")
        texts: list[str] = []
        answers = await agent(ws, turns=3, chars=400, sent=texts)
    assert len(answers) == 4
    sent = frames(standin)
    assert [r.status for r in sent] == [200] * 4 and sent[0].kind == "prewarm"
    # Fits means untouched: every frame reached the upstream as the client's bytes.
    assert [r.body for r in sent] == [t.encode() for t in texts]
    # Nothing to compact: upstream, every turn goes as its new items only.
    for record in sent[1:]:
        frame = orjson.loads(record.body)
        assert "previous_response_id" in frame
    assert orjson.loads(sent[1].body)["input"] == []
    assert [i["type"] for i in orjson.loads(sent[2].body)["input"]] == ["function_call_output"]
    # The upstream's upgrade carried the client's headers, and one socket served all.
    [upgrade] = [r for r in standin.recorded if r.method == "GET"]
    assert upgrade.headers["Authorization"] == AUTH["Authorization"]
    assert upgrade.headers["OpenAI-Beta"] == BETA["OpenAI-Beta"]
    metrics = await scrape(proxy)
    assert value(metrics, "compaction_proxy_websocket_sessions_total", outcome="relayed") == 1
    requests = value(metrics, "compaction_proxy_requests_total", route=PATH, status="200")
    assert requests == 4
    incremental = value(
        metrics, "compaction_proxy_websocket_upstream_request_bytes_total", form="incremental"
    )
    assert incremental > 0


async def test_a_long_session_is_compacted_on_the_socket(
    make_responses_standin: MakeResponsesStandIn,
    make_compacting_proxy: MakeProxy,
    session: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    standin = await standin_with(make_responses_standin)
    proxy = await proxy_for(make_compacting_proxy, standin.url)
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)
    headers = {**AUTH, **BETA, **stand_in(tool=EXEC, read_result=True)}
    async with session.ws_connect(proxy.url + PATH, headers=headers) as ws:
        answers = await agent(ws, turns=24, chars=6_000)
    # The client: one ordinary response per turn, never a read_result.
    for events in answers[1:]:
        kinds = [e["type"] for e in events]
        assert kinds.count("response.created") == 1 and kinds[-1] == "response.completed"
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        output = events[-1]["response"]["output"]
        assert all(item.get("name") != "read_result" for item in output)
    sent = frames(standin)
    assert all(r.status == 200 for r in sent), [(r.status, r.error) for r in sent]
    # Every upstream request fits the window, though the client's history does not.
    assert max(tokens(r) for r in sent) <= SMALL_WINDOW
    history = sum(len(tool_output(t, 6_000)) for t in range(24)) // 4
    assert history > SMALL_WINDOW
    # The proxy compacted (stubs, then a fold) and answered read_result on the socket.
    resolved = [orjson.loads(r.resolved) for r in sent]
    assert any("read_result" in orjson.dumps(b["tools"]).decode() for b in resolved)
    reads = [
        b
        for b in resolved
        if any(
            i.get("type") == "function_call" and i.get("name") == "read_result"
            for i in input_items(b)
        )
    ]
    assert reads, "the stand-in never called read_result"
    whole = [r for r in sent[1:] if "previous_response_id" not in orjson.loads(r.body)]
    incremental = [r for r in sent[1:] if "previous_response_id" in orjson.loads(r.body)]
    assert whole and incremental  # crossings sent whole, the turns between them not
    # One request log line per response.create, with its strategy.
    lines = [r.fields for r in caplog.records if r.name == REQUEST_LOGGER]  # type: ignore[attr-defined]
    ws_lines = [f for f in lines if f["method"] == "WS"]
    assert len(ws_lines) == len(answers) and all(f["status"] == 200 for f in ws_lines)
    strategies = {f["strategy"] for f in ws_lines}
    assert "none" in strategies and any(s.startswith("offload") for s in strategies), strategies
    assert any(f.get("read_rounds") for f in ws_lines)
    metrics = await scrape(proxy)
    assert value(metrics, "compaction_proxy_read_result_rounds_total") >= 1
    assert value(metrics, "compaction_proxy_offloads_total") >= 1


async def test_upgrades_the_upstream_refuses_get_426(
    make_responses_standin: MakeResponsesStandIn, make_compacting_proxy: MakeProxy, session: Any
) -> None:
    for status in (426, 404):
        standin = await standin_with(make_responses_standin, websocket_status=status)
        proxy = await proxy_for(make_compacting_proxy, standin.url)
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(proxy.url + PATH, headers={**AUTH, **BETA})
        assert refused.value.status == 426
    # Refused by the proxy's own setting: the upstream is not asked.
    standin = await standin_with(make_responses_standin)
    proxy = await proxy_for(make_compacting_proxy, standin.url, **{"responses.websocket": "refuse"})
    async with session.get(
        proxy.url + PATH,
        headers={
            **AUTH,
            **BETA,
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "c3RhbmQtaW4gd2Vic29jaw==",
        },
    ) as r:
        assert r.status == 426
        assert (await r.json())["error"]["code"] == "websocket_not_supported"
    assert not [r for r in standin.recorded if r.method == "GET"]
    # The upstream's 401 stays a 401.
    relaying = await proxy_for(make_compacting_proxy, standin.url)
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await session.ws_connect(relaying.url + PATH, headers=BETA)
    assert refused.value.status == 401


async def test_error_frames_and_closes_pass_through(
    make_responses_standin: MakeResponsesStandIn, make_compacting_proxy: MakeProxy, session: Any
) -> None:
    standin = await standin_with(make_responses_standin)
    proxy = await proxy_for(make_compacting_proxy, standin.url)
    headers = {**AUTH, **BETA, **stand_in(fault="429", fault_times=1)}
    async with session.ws_connect(proxy.url + PATH, headers=headers) as ws:
        await ws.send_str(create([message("user", "hi")]))
        [error] = await until_done(ws)
        assert error["status"] == 429 and error["error"]["code"] == "rate_limit_exceeded"
        assert int(error["headers"]["retry-after"]) >= 1
        # The socket goes on: the next request is answered.
        await ws.send_str(create([message("user", "hi")]))
        assert (await until_done(ws))[-1]["type"] == "response.completed"
        # A previous_response_id the socket does not keep goes to the upstream to refuse.
        await ws.send_str(create([message("user", "more")], previous="resp_unknown"))
        [error] = await until_done(ws)
        assert error["status"] == 400 and error["error"]["code"] == "previous_response_not_found"
        # A request the proxy refuses itself (nothing fits): an error frame in OpenAI's shape.
        huge = [message("developer", "rule " * 80_000), message("user", "go")]
        await ws.send_str(create(huge))
        [error] = await until_done(ws)
        assert error["status"] == 400 and error["error"]["code"] == "context_length_exceeded"
        # A binary frame reaches the upstream, whose close (1003) reaches the client.
        await ws.send_bytes(b"\x00")
        closing = await ws.receive(timeout=10)
        assert closing.type == aiohttp.WSMsgType.CLOSE
        assert closing.data == aiohttp.WSCloseCode.UNSUPPORTED_DATA
    statuses = [r.status for r in frames(standin)]
    assert statuses == [429, 200, 400]  # the proxy's own refusal never went upstream


@pytest.mark.parametrize("mode", ["serve", "auto"])
async def test_codex_compaction_is_served_on_the_socket(
    make_responses_standin: MakeResponsesStandIn,
    make_compacting_proxy: MakeProxy,
    session: Any,
    mode: str,
) -> None:
    """An upstream that knows no compaction items: the proxy answers Codex's
    compaction_trigger on the socket (auto: once the upstream's error frame refused it),
    and opens its sealed item in the next request."""
    standin = await standin_with(make_responses_standin, plays_openai=False)
    proxy = await proxy_for(
        make_compacting_proxy, standin.url, **{"responses.codex_compaction": mode}
    )
    history = [message("developer", INSTRUCTIONS), message("user", "Fix the build: step 42.")]
    async with session.ws_connect(proxy.url + PATH, headers={**AUTH, **BETA}) as ws:
        await ws.send_str(create(history))
        answered = await until_done(ws)
        previous = answered[-1]["response"]["id"]
        await ws.send_str(create([{"type": "compaction_trigger"}], previous))
        events = await until_done(ws)
        assert events[-1]["type"] == "response.completed", events[-1]
        [item] = events[-1]["response"]["output"]
        assert item["type"] == "compaction" and item["encrypted_content"].startswith("cpx1.")
        # Codex starts its next window over from the item, on the same socket.
        await ws.send_str(create([*history[:1], item, message("user", "go on")]))
        assert (await until_done(ws))[-1]["type"] == "response.completed"
    sent = frames(standin)
    triggers = [r for r in sent if b"compaction_trigger" in r.resolved]
    assert len(triggers) == (1 if mode == "auto" else 0)  # auto: the one refused upstream
    assert all(r.status == 400 for r in triggers)
    restarted = orjson.loads(sent[-1].resolved)
    text = orjson.dumps(restarted["input"]).decode()
    assert "cpx1." not in text and "[compaction-proxy: summary of the conversation" in text
    summaries = [r for r in standin.recorded if r.headers.get("x-compaction-proxy-purpose")]
    assert summaries and all(r.method == "POST" for r in summaries)
    # The summariser's POSTs carry the client's headers, not its WebSocket handshake.
    for summary in summaries:
        assert summary.headers["Authorization"] == AUTH["Authorization"]
        assert not any(h.lower().startswith("sec-websocket") for h in summary.headers)


async def test_keys_and_budgets_are_checked_and_settled_per_frame(
    make_responses_standin: MakeResponsesStandIn,
    monkeypatch: pytest.MonkeyPatch,
    redis_url: str,
    store: Any,
    session: Any,
) -> None:
    standin = await standin_with(make_responses_standin)
    monkeypatch.setenv(ENV, UPSTREAM_SECRET)
    settings = proxy_settings(
        "http://127.0.0.1:9",
        redis_url,
        **{
            "upstream.openai_url": standin.url,
            "auth.keys": "required",
            "auth.cache_seconds": 0.0,
            "store.key_prefix": store.prefix,
        },
    )
    proxy = await start(settings)
    try:
        accounts = Accounts(store)
        text, key_id = await new_key(accounts, provider="openai", **{"day:output": 1_500})
        headers = {"Authorization": f"Bearer {text}", **BETA, **stand_in(text="Done.")}
        async with session.ws_connect(proxy.url + PATH, headers=headers) as ws:
            await ws.send_str(create([message("user", "hi")], max_output_tokens=1_000))
            first = await until_done(ws)
            assert first[-1]["type"] == "response.completed"
            # Settled to what it used (not the 1,000 it held) once it ended.
            once = first[-1]["response"]["usage"]["output_tokens"]
            scope = Scope("key", key_id)
            assert await settled(accounts, scope, lambda u: u["output"] == once)
            # Over the budget as one frame: refused on the socket, which goes on.
            await ws.send_str(create([message("user", "more")], max_output_tokens=2_000))
            [refused] = await until_done(ws)
            assert refused["status"] == 429 and refused["error"]["type"] == "rate_limit_error"
            await ws.send_str(create([message("user", "again")], max_output_tokens=1_000))
            last = await until_done(ws)
            assert last[-1]["type"] == "response.completed"
            # The key is checked again for every frame: revoked, the socket serves no more.
            assert await accounts.revoke_key(key_id)
            await ws.send_str(create([message("user", "still there?")]))
            [revoked] = await until_done(ws)
            assert revoked["status"] == 401
        sent = frames(standin)
        assert [r.status for r in sent] == [200, 200]  # the refused frames never went upstream
        assert all(r.headers["Authorization"] == f"Bearer {UPSTREAM_SECRET}" for r in sent)
        # Each frame settled to its own reported usage.
        used = sum(e[-1]["response"]["usage"]["output_tokens"] for e in (first, last))
        assert await settled(accounts, scope, lambda u: u["output"] == used)
    finally:
        await proxy.stop()


async def test_a_frame_over_its_budget_is_refused_before_any_summary_is_made(
    make_responses_standin: MakeResponsesStandIn,
    monkeypatch: pytest.MonkeyPatch,
    redis_url: str,
    store: Any,
    session: Any,
) -> None:
    """The gate on the socket: a frame whose history would be folded, from a key that
    cannot afford its output cap, gets its 429 before the summariser is asked."""
    standin = await standin_with(make_responses_standin)
    monkeypatch.setenv(ENV, UPSTREAM_SECRET)
    base = proxy_settings(
        "http://127.0.0.1:9",
        redis_url,
        **{
            "upstream.openai_url": standin.url,
            "auth.keys": "required",
            "auth.cache_seconds": 0.0,
            "store.key_prefix": store.prefix,
        },
    )
    proxy = await start(dataclasses.replace(base, policies=(SMALL_WINDOW_POLICY,)))
    # A history over the fold's trigger (12,000 tokens) in one frame.
    history = [
        message("user" if i % 2 == 0 else "assistant", tool_output(i, 1_500)) for i in range(40)
    ]

    def summaries() -> list[RecordedRequest]:
        return [r for r in standin.recorded if r.headers.get(PURPOSE) == "summary"]

    try:
        accounts = Accounts(store)
        for limit, cap, expect in ((1_500, 2_000, 429), (100_000, 1_000, 200)):
            text, _ = await new_key(accounts, provider="openai", **{"day:output": limit})
            headers = {"Authorization": f"Bearer {text}", **BETA, **stand_in(text="Done.")}
            before = len(summaries())
            async with session.ws_connect(proxy.url + PATH, headers=headers) as ws:
                await ws.send_str(create(history, max_output_tokens=cap))
                end = (await until_done(ws))[-1]
            if expect == 429:
                assert end["type"] == "error" and end["status"] == 429, end
                assert len(summaries()) == before  # nothing spent for a refused frame
            else:  # the same frame within its budget is folded: a summary was asked for
                assert end["type"] == "response.completed", end
                assert len(summaries()) > before
    finally:
        await proxy.stop()


async def test_frame_size_and_idle_timeout_close_both_sockets(
    make_responses_standin: MakeResponsesStandIn, make_compacting_proxy: MakeProxy, session: Any
) -> None:
    standin = await standin_with(make_responses_standin)
    proxy = await proxy_for(
        make_compacting_proxy,
        standin.url,
        **{"responses.websocket_max_frame": 65_536, "responses.websocket_idle_timeout": 0.5},
    )
    async with session.ws_connect(proxy.url + PATH, headers={**AUTH, **BETA}) as ws:
        await ws.send_str(create([message("user", "x" * 70_000)]))
        closing = await ws.receive(timeout=10)
        assert closing.type == aiohttp.WSMsgType.CLOSE
        assert closing.data == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
    async with session.ws_connect(proxy.url + PATH, headers={**AUTH, **BETA}) as ws:
        await ws.send_str(create([message("user", "hi")]))
        assert (await until_done(ws))[-1]["type"] == "response.completed"
        closing = await ws.receive(timeout=10)  # then nothing for longer than the timeout
        assert closing.type == aiohttp.WSMsgType.CLOSE and closing.data == 1000
    assert [r.status for r in frames(standin)] == [200]  # the big frame never went upstream
    metrics = await scrape(proxy)
    assert value(metrics, "compaction_proxy_websocket_open") == 0


async def test_a_draining_proxy_closes_idle_sockets_going_away(
    make_responses_standin: MakeResponsesStandIn, make_compacting_proxy: MakeProxy, session: Any
) -> None:
    standin = await standin_with(make_responses_standin)
    proxy = await proxy_for(make_compacting_proxy, standin.url)
    async with session.ws_connect(proxy.url + PATH, headers={**AUTH, **BETA}) as ws:
        await ws.send_str(create([message("user", "hi")]))
        assert (await until_done(ws))[-1]["type"] == "response.completed"
        drained = asyncio.create_task(proxy.app[LIFECYCLE].drain(10.0))
        closing = await ws.receive(timeout=10)
        assert closing.type == aiohttp.WSMsgType.CLOSE
        assert closing.data == aiohttp.WSCloseCode.GOING_AWAY
        assert await drained  # nothing left open: the drain ended before its timeout


async def test_frames_in_order_and_upstream_failures_close_the_client(
    make_responses_standin: MakeResponsesStandIn, make_compacting_proxy: MakeProxy, session: Any
) -> None:
    standin = await standin_with(make_responses_standin)
    proxy = await proxy_for(
        make_compacting_proxy, standin.url, **{"upstream.stream_idle_timeout": 0.5}
    )
    async with session.ws_connect(proxy.url + PATH, headers={**AUTH, **BETA}) as ws:
        # Two requests sent at once are answered one after the other, in order.
        await ws.send_str(create([message("user", "first")]))
        await ws.send_str(create([message("user", "second")]))
        one, two = await until_done(ws), await until_done(ws)
        assert one[-1]["type"] == two[-1]["type"] == "response.completed"
        assert one[-1]["response"]["id"] != two[-1]["response"]["id"]
    resolved = [orjson.loads(r.resolved)["input"][0]["content"] for r in frames(standin)]
    assert resolved == [message("user", "first")["content"], message("user", "second")["content"]]
    # The upstream cuts the connection mid-response: the client's socket closes too.
    cut = stand_in(fault="eof", text="a b c d e f g h")
    async with session.ws_connect(proxy.url + PATH, headers={**AUTH, **BETA, **cut}) as ws:
        await ws.send_str(create([message("user", "hi")]))
        while (got := await ws.receive(timeout=10)).type == aiohttp.WSMsgType.TEXT:
            assert orjson.loads(got.data)["type"] != "response.completed"
        assert (
            got.type == aiohttp.WSMsgType.CLOSE and got.data == aiohttp.WSCloseCode.INTERNAL_ERROR
        )
    # The upstream goes silent mid-response past its idle timeout: both close.
    stall = stand_in(fault="stall", stall_seconds=3)
    async with session.ws_connect(proxy.url + PATH, headers={**AUTH, **BETA, **stall}) as ws:
        await ws.send_str(create([message("user", "hi")]))
        while (got := await ws.receive(timeout=10)).type == aiohttp.WSMsgType.TEXT:
            pass
        assert (
            got.type == aiohttp.WSMsgType.CLOSE and got.data == aiohttp.WSCloseCode.INTERNAL_ERROR
        )
    # An upstream that cannot be reached: 502 to the upgrade (Codex retries, then HTTP).
    gone = await proxy_for(make_compacting_proxy, "http://127.0.0.1:9")
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await session.ws_connect(gone.url + PATH, headers={**AUTH, **BETA})
    assert refused.value.status == 502


async def test_the_openai_sdk_websocket_client_through_the_proxy(
    make_responses_standin: MakeResponsesStandIn, make_compacting_proxy: MakeProxy
) -> None:
    """The openai SDK's own Responses WebSocket (`client.responses.connect()`, no beta
    header) through the proxy: typed events, previous_response_id resolved on the socket."""
    standin = await standin_with(make_responses_standin)
    proxy = await proxy_for(make_compacting_proxy, standin.url)
    client = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-sdk-ws", max_retries=0)
    script = stand_in(text="Hello from the socket.")
    async with client.responses.connect(extra_headers=script, max_retries=0) as connection:
        ids = []
        for text in ("hi", "and again"):
            event: dict[str, Any] = {
                "type": "response.create",
                "model": "gpt-test",
                "input": [message("user", text)],
                "store": False,
            }
            if ids:
                event["previous_response_id"] = ids[-1]
            await connection.send(event)  # type: ignore[arg-type]
            kinds = []
            async for got in connection:
                kinds.append(got.type)
                if got.type == "response.completed":
                    ids.append(got.response.id)
                    assert got.response.output_text == "Hello from the socket."
                    break
            assert kinds[0] == "response.created" and "response.output_text.delta" in kinds
    await client.close()
    sent = frames(standin)
    assert [r.status for r in sent] == [200, 200]
    second = orjson.loads(sent[1].body)
    assert second["previous_response_id"] and len(second["input"]) == 1  # only the new item
    whole = orjson.loads(sent[1].resolved)["input"]
    assert [i.get("role") for i in whole] == ["user", "assistant", "user"]
