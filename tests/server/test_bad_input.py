"""Bad input never makes a rewrite worse, and what is kept is kept exactly (issue 36's
findings, each through a real proxy on a loopback port, real Redis, the strict stand-in).

The policy is the battery's (tests/battery): window 20k, offload from 1.5k, fold at 6k
down to 4k.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.server.app import RunningProxy, start
from proxy.testing.standin import StandInOptions
from tests.battery.policy import BATTERY_POLICY, BATTERY_WINDOW
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import proxy_settings

MakeStandIn = Callable[[StandInOptions], Awaitable[RunningStandIn]]
HEADERS = {"x-api-key": "sk-bad-input", "anthropic-version": "2023-06-01"}
BIG = b"123456789012345678901234567890"


@pytest.fixture
async def battery_proxy(
    redis_url: str, redis_key_prefix: str
) -> AsyncIterator[Callable[[str], Awaitable[RunningProxy]]]:
    started: list[RunningProxy] = []

    async def make(upstream_url: str) -> RunningProxy:
        settings = proxy_settings(upstream_url, redis_url, **{"store.key_prefix": redis_key_prefix})
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
