"""Bad input never makes a rewrite worse, and what is kept is kept exactly (issue 36's
findings, each through a real proxy on a loopback port, real Redis, the strict stand-in).

The policy is the battery's (tests/battery): window 20k, offload from 1.5k, fold at 6k
down to 4k.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.server import tasks
from proxy.server.app import RunningProxy, start
from proxy.server.compactor import Compactor
from proxy.server.metrics import Metrics
from proxy.server.prepared import redacted
from proxy.server.state import COMPACTOR
from proxy.testing.standin import StandInOptions
from proxy.wire.chat_validation import validate_chat_request
from tests.battery.policy import BATTERY_POLICY, BATTERY_WINDOW
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import proxy_settings

MakeStandIn = Callable[[StandInOptions], Awaitable[RunningStandIn]]
HEADERS = {"x-api-key": "sk-bad-input", "anthropic-version": "2023-06-01"}
OPENAI = {"authorization": "Bearer sk-bad-input"}
PURPOSE = "x-compaction-proxy-purpose"
BIG = b"123456789012345678901234567890"


@pytest.fixture
async def battery_proxy(
    redis_url: str, redis_key_prefix: str
) -> AsyncIterator[Callable[[str], Awaitable[RunningProxy]]]:
    started: list[RunningProxy] = []

    async def make(upstream_url: str) -> RunningProxy:
        settings = proxy_settings(
            upstream_url,
            redis_url,
            **{"store.key_prefix": redis_key_prefix, "upstream.openai_url": upstream_url},
        )
        started.append(await start(dataclasses.replace(settings, policies=(BATTERY_POLICY,))))
        return started[-1]

    yield make
    for running in started:
        await running.stop()


async def post(
    proxy: RunningProxy, path: str, body: bytes, **headers: str
) -> tuple[int, dict[str, str], Any]:
    sent = {**HEADERS, "content-type": "application/json", **headers}
    async with (
        aiohttp.ClientSession() as session,
        session.post(proxy.url + path, data=body, headers=sent) as response,
    ):
        return response.status, dict(response.headers), await response.json(content_type=None)


def words(n: int, word: str = "lorem") -> bytes:
    return " ".join(f"{word}{i % 97}" for i in range(n)).encode()


async def test_a_kept_integer_beyond_64_bits_reaches_the_upstream_as_sent(
    make_standin: MakeStandIn,
    battery_proxy: Callable[[str], Awaitable[RunningProxy]],
) -> None:
    """An old tool call's input holds a 30-digit build id; a later result crosses the
    offload threshold: the message holding the id is kept, so its digits arrive as sent
    (orjson reads them as a float, 1.2345678901234568e+29), in the read_result round the
    model asks for too."""
    standin = await make_standin(StandInOptions(windows={"*": BATTERY_WINDOW}))
    proxy = await battery_proxy(standin.url)
    call = b'{"role":"assistant","content":[{"type":"tool_use","id":"toolu_b1","name":"build",'
    call += b'"input":{"build_id":' + BIG + b"}}]}"
    messages = [
        b'{"role":"user","content":"Build it and report."}',
        call,
        b'{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_b1","content":"'
        + words(2_500)
        + b'"}]}',
        b'{"role":"assistant","content":[{"type":"tool_use","id":"toolu_b2","name":"build",'
        b'"input":{}}]}',
        b'{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_b2","content":"'
        + words(400, "ipsum")
        + b'"}]}',
        b'{"role":"user","content":"What was the build id?"}',
    ]
    tools = b'[{"name":"build","input_schema":{"type":"object"}}]'
    body = b'{"model":"claude-sonnet-4-5","max_tokens":200,"tools":' + tools
    body += b',"messages":[' + b",".join(messages) + b"]}"

    status, headers, answer = await post(
        proxy, "/v1/messages", body, **{"x-stand-in": '{"read_result": true}'}
    )

    assert status == 200, answer
    assert headers.get("x-compaction-strategy") == "offload"
    assert headers.get("x-compaction-read-rounds") == "1"
    rounds = standin.agent_calls
    assert len(rounds) == 2
    for sent in rounds:
        assert sent.status == 200
        assert call in sent.body, "the kept tool call went up as the client wrote it"
        assert b"e+29" not in sent.body
        assert orjson.loads(sent.body)["messages"][1] == orjson.loads(call)


# -- finding 2: an invalid history is never rewritten, and never summarised ---------------


def messages_body(messages: list[bytes], head: bytes = b'"max_tokens":200') -> bytes:
    tools = b'[{"name":"build","input_schema":{"type":"object"}}]'
    return (
        b'{"model":"claude-sonnet-4-5",' + head + b',"tools":' + tools
        + b',"messages":[' + b",".join(messages) + b"]}"
    )  # fmt: skip


def offloaded_history(last: bytes) -> list[bytes]:
    """~5.6k tokens: an old result over the offload threshold, then the newest question."""
    return [
        b'{"role":"user","content":"Build it and report."}',
        b'{"role":"assistant","content":[{"type":"tool_use","id":"toolu_b1","name":"build",'
        b'"input":{}}]}',
        b'{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_b1","content":"'
        + words(2_000)
        + b'"}]}',
        b'{"role":"assistant","content":[{"type":"tool_use","id":"toolu_b2","name":"build",'
        b'"input":{}}]}',
        b'{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_b2",'
        b'"content":"ok"}]}',
        b'{"role":"assistant","content":"Built."}',
        last,
    ]


QUESTION = b'{"role":"user","content":"What failed?"}'
ORPHAN = (
    b'{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_NOPE",'
    b'"content":"late"},{"type":"text","text":"What failed?"}]}'
)
# Each breaks one of the API's rules in a request the proxy would otherwise offload.
INVALID_MESSAGES = {
    "orphan_result": messages_body(offloaded_history(ORPHAN)),
    "empty_system_text": messages_body(
        offloaded_history(QUESTION), b'"max_tokens":200,"system":[{"type":"text","text":""}]'
    ),
    "max_tokens_string": messages_body(offloaded_history(QUESTION), b'"max_tokens":"100"'),
    "stream_string": messages_body(offloaded_history(QUESTION), b'"max_tokens":200,"stream":"yes"'),
}


async def metric_lines(proxy: RunningProxy, name: str) -> list[str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(proxy.url + "/metrics") as response,
    ):
        text = await response.text()
    return [line for line in text.splitlines() if line.startswith(name)]


async def test_the_valid_history_of_the_invalid_cases_is_offloaded(
    make_standin: MakeStandIn,
    battery_proxy: Callable[[str], Awaitable[RunningProxy]],
) -> None:
    """The control: the same history, valid, is rewritten (so an untouched one below is
    the proxy declining, not a history under its thresholds)."""
    standin = await make_standin(StandInOptions(windows={"*": BATTERY_WINDOW}))
    proxy = await battery_proxy(standin.url)
    status, headers, answer = await post(
        proxy, "/v1/messages", messages_body(offloaded_history(QUESTION))
    )
    assert status == 200, answer
    assert headers.get("x-compaction-strategy") == "offload"


@pytest.mark.parametrize("case", sorted(INVALID_MESSAGES))
async def test_an_invalid_messages_request_goes_up_as_sent_for_the_apis_own_error(
    make_standin: MakeStandIn,
    battery_proxy: Callable[[str], Awaitable[RunningProxy]],
    case: str,
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": BATTERY_WINDOW}))
    proxy = await battery_proxy(standin.url)
    body = INVALID_MESSAGES[case]

    status, headers, answer = await post(proxy, "/v1/messages", body)
    await proxy.app[COMPACTOR].settled()

    [sent] = standin.recorded  # no summariser call, no second round
    assert sent.body == body, "sent byte for byte"
    assert sent.status == 400
    assert status == 400
    assert answer["type"] == "error"
    assert answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["message"] == sent.error, "the API's own error"
    assert headers.get("x-compaction-reason") == "invalid_request"
    assert "x-compaction-strategy" not in headers
    declined = await metric_lines(proxy, "compaction_proxy_compaction_declined_total")
    assert declined == ['compaction_proxy_compaction_declined_total{reason="invalid_request"} 1.0']


def chat_body(messages: list[bytes]) -> bytes:
    tools = b'[{"type":"function","function":{"name":"build","parameters":{"type":"object"}}}]'
    return (
        b'{"model":"gpt-4o","max_tokens":200,"tools":' + tools
        + b',"messages":[' + b",".join(messages) + b"]}"
    )  # fmt: skip


CHAT_CALL = (
    b'{"role":"assistant","content":null,"tool_calls":[{"id":"call_b1","type":"function",'
    b'"function":{"name":"build","arguments":"{}"}}]}'
)


async def test_a_stray_chat_tool_message_goes_up_as_sent(
    make_standin: MakeStandIn,
    battery_proxy: Callable[[str], Awaitable[RunningProxy]],
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": BATTERY_WINDOW}))
    proxy = await battery_proxy(standin.url)
    history = [
        b'{"role":"user","content":"Build it and report."}',
        CHAT_CALL,
        b'{"role":"tool","tool_call_id":"call_b1","content":"' + words(2_000) + b'"}',
        CHAT_CALL.replace(b"call_b1", b"call_b2"),
        b'{"role":"tool","tool_call_id":"call_b2","content":"ok"}',
        b'{"role":"assistant","content":"Built."}',
        b'{"role":"user","content":"What failed?"}',
    ]
    valid = chat_body(history)
    status, headers, answer = await post(proxy, "/v1/chat/completions", valid, **OPENAI)
    assert status == 200, answer
    assert headers.get("x-compaction-strategy") == "offload", "the control is rewritten"

    stray = b'{"role":"tool","tool_call_id":"call_NOPE","content":"late"}'
    body = chat_body([*history, stray])
    status, headers, answer = await post(proxy, "/v1/chat/completions", body, **OPENAI)
    await proxy.app[COMPACTOR].settled()

    sent = standin.recorded[-1]
    assert sent.body == body, "sent byte for byte"
    assert sent.status == 400
    assert status == 400
    refused = validate_chat_request(orjson.loads(body))
    assert refused is not None
    assert answer["error"]["message"] == refused.message, "the API's own error"
    assert headers.get("x-compaction-reason") == "invalid_request"
    assert not [r for r in standin.recorded if r.headers.get(PURPOSE)]


@pytest.mark.parametrize("api", ["messages", "chat"])
async def test_an_unanswered_call_is_never_summarised(
    make_standin: MakeStandIn,
    battery_proxy: Callable[[str], Awaitable[RunningProxy]],
    api: str,
) -> None:
    """A call never answered, then "go on", ~7k tokens over the fold trigger: no summary
    (made ahead or in place) is asked for a history that cannot be sent."""
    standin = await make_standin(StandInOptions(windows={"*": BATTERY_WINDOW}))
    proxy = await battery_proxy(standin.url)
    turns = [
        (b"Plan the build. " + words(700, f"turn{n}x"), b"Planned. " + words(700, f"done{n}x"))
        for n in range(3)
    ]
    history = [
        part
        for ask, reply in turns
        for part in (
            b'{"role":"user","content":"' + ask + b'"}',
            b'{"role":"assistant","content":"' + reply + b'"}',
        )
    ]
    go, go_on = b'{"role":"user","content":"Go."}', b'{"role":"user","content":"go on"}'
    if api == "messages":
        call = b'{"role":"assistant","content":[{"type":"tool_use","id":"toolu_u1",'
        call += b'"name":"build","input":{}}]}'
        body = messages_body([*history, go, call, go_on])
        path, headers_sent = "/v1/messages", {}
    else:
        body = chat_body([*history, go, CHAT_CALL, go_on])
        path, headers_sent = "/v1/chat/completions", OPENAI

    status, headers, answer = await post(proxy, path, body, **headers_sent)
    await proxy.app[COMPACTOR].settled()

    assert status == 400, answer
    assert [r.body for r in standin.recorded] == [body], "no summariser call, sent as it came"
    assert headers.get("x-compaction-reason") == "invalid_request"


# -- finding 3: never an empty history, never the pinned last user message dropped ---------


async def test_one_user_message_with_an_orphan_result_is_never_sent_empty(
    make_standin: MakeStandIn,
    battery_proxy: Callable[[str], Awaitable[RunningProxy]],
) -> None:
    """The issue's case: its one message was taken for a malformed group and packed away
    (reason no_fold, tokens after 0), and `"messages": []` went up."""
    standin = await make_standin(StandInOptions(windows={"*": BATTERY_WINDOW}))
    proxy = await battery_proxy(standin.url)
    only = b'{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_NOPE",'
    only += b'"content":"late"},{"type":"text","text":"' + words(9_000) + b'"}]}'
    body = messages_body([only])

    status, headers, answer = await post(proxy, "/v1/messages", body)
    await proxy.app[COMPACTOR].settled()

    assert all(b'"messages":[]' not in r.body for r in standin.recorded)
    [sent] = standin.recorded
    assert sent.body == body
    assert status == 400
    assert answer["error"]["message"] == sent.error, "the API's own error"
    assert headers.get("x-compaction-reason") == "invalid_request"


async def test_a_question_alone_over_the_trigger_keeps_the_question(
    make_standin: MakeStandIn,
    battery_proxy: Callable[[str], Awaitable[RunningProxy]],
) -> None:
    """Valid, the same question alone: within the window it goes up (nothing can be
    dropped); beyond it the proxy refuses as the API would, sending nothing."""
    standin = await make_standin(StandInOptions(windows={"*": BATTERY_WINDOW}))
    proxy = await battery_proxy(standin.url)
    fits = messages_body([b'{"role":"user","content":"' + words(7_000) + b'"}'])
    status, _, answer = await post(proxy, "/v1/messages", fits)
    assert status == 200, answer
    [sent] = standin.recorded
    assert orjson.loads(sent.body)["messages"] == orjson.loads(fits)["messages"]

    too_long = messages_body([b'{"role":"user","content":"' + words(11_000) + b'"}'])
    status, _, answer = await post(proxy, "/v1/messages", too_long)
    assert status == 400
    assert answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["message"].startswith("prompt is too long")
    assert len(standin.recorded) == 1, "nothing sent for it"


# -- finding 4: deep and odd bodies; background failures --------------------------------


def deep_history(depth: int, where: str) -> bytes:
    """~16k tokens over the 6k fold trigger, a value nested `depth` levels deep in an old
    tool call's input or in the newest one's."""
    deep = b"[" * depth + b"1" + b"]" * depth
    old, new = (deep, b"2") if where == "old" else (b"1", deep)
    call = b'{"role":"assistant","content":[{"type":"tool_use","id":"toolu_d%d","name":"build",'
    messages = [
        b'{"role":"user","content":"Go."}',
        call % 1 + b'"input":{"v":' + old + b"}}]}",
        b'{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_d1","content":"'
        + words(2_000)
        + b'"}]}',
    ]
    for n in range(3):
        messages += [
            b'{"role":"assistant","content":"' + words(450, f"a{n}x") + b'"}',
            b'{"role":"user","content":"' + words(450, f"u{n}x") + b'"}',
        ]
    messages += [
        call % 2 + b'"input":{"v":' + new + b"}}]}",
        b'{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_d2",'
        b'"content":"ok"}]}',
    ]
    return messages_body(messages)


@pytest.mark.parametrize("where", ["old", "new"])
@pytest.mark.parametrize("depth", [255, 600, 1015])
async def test_a_body_nested_deeper_than_json_is_written_declines_cleanly(
    make_standin: MakeStandIn,
    battery_proxy: Callable[[str], Awaitable[RunningProxy]],
    caplog: pytest.LogCaptureFixture,
    depth: int,
    where: str,
) -> None:
    """orjson reads 1024 levels and writes 255: compaction declines with a warning
    naming the reason and a metric; the request goes up as it came."""
    standin = await make_standin(StandInOptions(windows={"*": BATTERY_WINDOW}))
    proxy = await battery_proxy(standin.url)
    body = deep_history(depth, where)

    status, headers, answer = await post(proxy, "/v1/messages", body)
    await proxy.app[COMPACTOR].settled()

    assert status == 200, answer
    assert [r.body for r in standin.recorded] == [body]
    assert headers.get("x-compaction-reason") == "too_deep"
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.levelname, r.getMessage()[:35]) for r in warned] == [
        ("WARNING", "compaction declined (too_deep): the")
    ]
    declined = await metric_lines(proxy, "compaction_proxy_compaction_declined_total")
    assert declined == ['compaction_proxy_compaction_declined_total{reason="too_deep"} 1.0']


async def test_a_background_task_that_fails_is_logged_once_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A summary made ahead (any background work of the compactor) that raises: its
    error is retrieved, logged once with its traceback and counted; asyncio never
    reports "Task exception was never retrieved"."""
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    compactor = Compactor()
    before = tasks.FAILURES["compaction"]

    async def fails() -> None:
        raise ValueError("boom")

    compactor.spawn(fails())
    await compactor.settled()
    await asyncio.sleep(0)  # (the done callbacks run)
    gc.collect()

    assert tasks.FAILURES["compaction"] == before + 1
    failed = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in failed] == ["background compaction task failed: ValueError"]
    assert failed[0].exc_info is not None
    assert unhandled == []
    collected = {m.name: m for m in Metrics().registry.collect()}
    family = collected["compaction_proxy_background_task_failures"]
    assert ("compaction", before + 1) in {(s.labels["task"], s.value) for s in family.samples}


def test_a_declined_rule_is_logged_without_the_clients_long_values() -> None:
    """The warning names the rule and short values (ids, roles), never a long one the
    client put where the rule echoes it (no prompt text in the log)."""
    prompt = "secret plan " * 20
    logged = redacted(f"Invalid value: '{prompt}'. Supported values are: 'user', 'system'.")
    assert prompt not in logged
    assert logged == "Invalid value: '...'. Supported values are: 'user', 'system'."
    assert "toolu_NOPE" in redacted("unexpected `tool_use_id` found: toolu_NOPE.")
    assert len(redacted("x" * 5_000)) == 300
