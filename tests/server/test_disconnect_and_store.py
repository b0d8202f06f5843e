"""A client that goes away cancels the upstream request; a store that goes away does not
stop the forwarding."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import orjson

from proxy.server.state import STORE
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import MakeProxy
from tests.server.rawupstream import RawUpstream

HEADERS = {"x-api-key": "sk-test", "anthropic-version": "2023-06-01"}
REQUEST = {
    "model": "claude-haiku-4-5",
    "max_tokens": 64,
    "stream": True,
    "messages": [{"role": "user", "content": "hello"}],
}


async def eventually(condition: object, seconds: float = 10.0) -> bool:
    """Poll a zero-argument callable until it is true (bounded, not a timing check)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        if condition():  # type: ignore[operator]
            return True
        await asyncio.sleep(0.02)
    return False


async def test_client_disconnect_cancels_the_upstream_stream(
    standin: RunningStandIn, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(standin.url)
    headers = {**HEADERS, "x-stand-in": '{"fault": "stall", "stall_seconds": 60}'}
    async with aiohttp.ClientSession() as client:
        response = await client.post(
            f"{proxy.url}/v1/messages", data=orjson.dumps(REQUEST), headers=headers
        )
        first = await response.content.readuntil(b"\n\n")
        assert first.startswith(b"event: message_start")
        assert standin.recorded[-1].outcome == "open"
        response.close()  # the client goes away mid-stream
    assert await eventually(lambda: standin.recorded[-1].outcome == "cancelled")


async def test_client_disconnect_closes_the_upstream_connection(make_proxy: MakeProxy) -> None:
    upstream = await RawUpstream().start()
    try:
        upstream.scripts["/v1/messages"] = [b"event: ping\ndata: {}\n\n", 60.0]
        proxy = await make_proxy(upstream.url)
        async with aiohttp.ClientSession() as client:
            response = await client.post(f"{proxy.url}/v1/messages", data=b"{}")
            assert await response.content.readuntil(b"\n\n") == b"event: ping\ndata: {}\n\n"
            response.close()
        assert await eventually(lambda: upstream.closed["/v1/messages"].is_set())
    finally:
        await upstream.stop()


async def test_forwarding_goes_on_when_redis_stops(
    standin: RunningStandIn, make_proxy: MakeProxy, tmp_path: Path
) -> None:
    # No Redis URL: the proxy starts (and owns) an embedded Redis under its state dir.
    proxy = await make_proxy(
        standin.url, **{"store.redis_url": "", "store.state_dir": str(tmp_path)}
    )
    async with aiohttp.ClientSession() as client:
        async with client.get(f"{proxy.url}/readyz") as ready:
            assert ready.status == 200
            assert (await ready.json())["store"] == "ok"
        embedded = proxy.app[STORE].embedded
        assert embedded is not None and embedded.running
        await embedded.stop()

        body = orjson.dumps({**REQUEST, "stream": False})
        async with client.post(f"{proxy.url}/v1/messages", data=body, headers=HEADERS) as r:
            assert r.status == 200
            assert (await r.json())["type"] == "message"
        async with client.get(f"{proxy.url}/readyz") as ready:
            assert ready.status == 503
            report = await ready.json()
            assert report["ready"] is False
            assert report["store"] == "unreachable"
        async with client.get(f"{proxy.url}/healthz") as alive:
            assert alive.status == 200


async def test_proxy_starts_with_redis_unreachable(
    standin: RunningStandIn, make_proxy: MakeProxy, tmp_path: Path
) -> None:
    proxy = await make_proxy(standin.url, **{"store.redis_url": f"unix://{tmp_path}/none.sock"})
    async with aiohttp.ClientSession() as client:
        async with client.get(f"{proxy.url}/readyz") as ready:
            assert ready.status == 503
        body = orjson.dumps({**REQUEST, "stream": False})
        async with client.post(f"{proxy.url}/v1/messages", data=body, headers=HEADERS) as r:
            assert r.status == 200


async def test_proxy_forwards_when_the_embedded_redis_cannot_start(
    standin: RunningStandIn, make_proxy: MakeProxy, tmp_path: Path
) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    proxy = await make_proxy(
        standin.url, **{"store.redis_url": "", "store.state_dir": str(not_a_dir)}
    )
    async with aiohttp.ClientSession() as client:
        async with client.get(f"{proxy.url}/readyz") as ready:
            assert ready.status == 503
            assert (await ready.json())["store"].startswith("unavailable: embedded Redis")
        body = orjson.dumps({**REQUEST, "stream": False})
        async with client.post(f"{proxy.url}/v1/messages", data=body, headers=HEADERS) as r:
            assert r.status == 200
