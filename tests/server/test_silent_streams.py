"""An upstream stream that goes silent ends the same way whoever carries it: relayed as
bytes (a request that fits) or merged from read_result rounds (a request the proxy
offloaded and offered read_result): the client's stream gets the API's error event and
a proper end, never a cut (proxy/server/transport.py `end_with_error`)."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from proxy.testing.agent import tool_output
from tests.server.conftest import MakeProxy
from tests.server.rawupstream import RawUpstream
from tests.server.sse import parse_events

START = b'event: message_start\ndata: {"type":"message_start","message":{"usage":{}}}\n\n'


def history(results: int, chars: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Find the failing test."}]
    for n in range(results):
        call = {"type": "tool_use", "id": f"toolu_{n:03d}", "name": "Bash", "input": {"n": n}}
        result = {
            "type": "tool_result",
            "tool_use_id": call["id"],
            "content": tool_output(n, chars),
        }
        messages += [
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [result]},
        ]
    messages.append({"role": "assistant", "content": "Those were the logs."})
    messages.append({"role": "user", "content": "Which test fails?"})
    return messages


async def test_a_silent_stream_ends_the_same_way_relayed_or_merged(
    make_compacting_proxy: MakeProxy,
) -> None:
    upstream = await RawUpstream().start()
    try:
        proxy = await make_compacting_proxy(upstream.url, **{"upstream.stream_idle_timeout": 0.5})
        endings = {}
        async with aiohttp.ClientSession() as session:
            # Under every threshold (relayed), then over the offload trigger (merged).
            for name, messages in (("relayed", history(1, 200)), ("merged", history(4, 9_000))):
                path = f"/v1/messages?case={name}"
                upstream.scripts[path] = [START, 30.0]
                body = {"model": "m", "max_tokens": 100, "stream": True, "messages": messages}
                async with session.post(proxy.url + path, data=orjson.dumps(body)) as response:
                    assert response.status == 200
                    strategy = response.headers.get("x-compaction-strategy")
                    raw = await response.read()  # a cut stream would raise here
                events = parse_events(raw)
                assert events[0] == parse_events(START)[0], name
                assert events[-1][0] == "error" and len(events) == 2, (name, events)
                error = orjson.loads(events[-1][1])["error"]
                endings[name] = (strategy, error["type"], error["message"])
        assert endings["relayed"][0] is None and endings["merged"][0] == "offload"
        assert endings["relayed"][1:] == endings["merged"][1:]
        assert endings["merged"][1] == "api_error" and "went silent" in endings["merged"][2]
    finally:
        await upstream.stop()
