"""SSE relay: any chunking arrives as the same events; huge lines; a stream that breaks
or goes silent."""

from __future__ import annotations

import asyncio
import http.client
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import count, pairwise
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.usage import UsageMeter
from proxy.server.app import RunningProxy, start
from tests.server.conftest import proxy_settings
from tests.server.rawupstream import CUT, RawUpstream
from tests.server.sse import parse_events

BODY = b'{"model":"m","max_tokens":10,"stream":true,"messages":[]}'


@dataclass
class Rig:
    loop: asyncio.AbstractEventLoop
    upstream: RawUpstream
    proxy: RunningProxy  # upstream.stream_idle_timeout at its default
    quick_proxy: RunningProxy  # upstream.stream_idle_timeout = 0.5 s
    cases: Iterator[int]

    def call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=60)

    def post(self, steps: list[Any], *, quick: bool = False) -> tuple[int, bytes, bool]:
        """Script the upstream, POST a stream request through the proxy; returns the
        status, the body and whether it ended properly."""
        path = f"/v1/messages?case={next(self.cases)}"
        self.upstream.scripts[path] = steps
        target = urlsplit((self.quick_proxy if quick else self.proxy).url)
        connection = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
        try:
            connection.request("POST", path, BODY, {"content-type": "application/json"})
            response = connection.getresponse()
            try:
                return response.status, response.read(), True
            except http.client.IncompleteRead as e:
                return response.status, e.partial, False
        finally:
            connection.close()


@pytest.fixture(scope="module")
def rig(redis_url: str) -> Iterator[Rig]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def setup() -> tuple[RawUpstream, RunningProxy, RunningProxy]:
        upstream = await RawUpstream().start()
        proxy = await start(proxy_settings(upstream.url, redis_url))
        quick = await start(
            proxy_settings(upstream.url, redis_url, **{"upstream.stream_idle_timeout": 0.5})
        )
        return upstream, proxy, quick

    upstream, proxy, quick = asyncio.run_coroutine_threadsafe(setup(), loop).result(60)
    rig = Rig(loop, upstream, proxy, quick, count())
    yield rig
    rig.call(proxy.stop())
    rig.call(quick.stop())
    rig.call(upstream.stop())
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=30)
    loop.close()


def sse(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


EVENT_NAMES = st.sampled_from(
    ["message_start", "content_block_delta", "ping", "message_stop", "error", "brand_new"]
)
EVENTS = st.lists(
    st.tuples(EVENT_NAMES, st.text(min_size=0, max_size=200)).map(
        lambda e: sse(e[0], {"type": e[0], "text": e[1]})
    ),
    min_size=1,
    max_size=12,
)


def cut(stream: bytes, points: list[int]) -> list[bytes]:
    edges = [0, *sorted(set(points)), len(stream)]
    return [stream[a:b] for a, b in pairwise(edges) if b > a]


@settings(max_examples=40, deadline=None)
@given(events=EVENTS, data=st.data())
def test_any_chunking_arrives_as_the_same_events(rig: Rig, events: list[bytes], data: Any) -> None:
    stream = b"".join(events)
    points = data.draw(st.lists(st.integers(1, len(stream) - 1), max_size=40))
    status, body, complete = rig.post(cut(stream, points))
    assert (status, complete) == (200, True)
    assert parse_events(body) == parse_events(stream)
    assert body == stream


def test_an_event_line_over_one_megabyte_survives(rig: Rig) -> None:
    big = sse("content_block_delta", {"type": "content_block_delta", "text": "x" * 3_000_000})
    stream = sse("message_start", {"type": "message_start"}) + big + sse("message_stop", {})
    status, body, complete = rig.post(cut(stream, list(range(1, len(stream), 65_000))))
    assert (status, complete, body) == (200, True, stream)


def test_an_error_event_after_the_200_is_relayed(rig: Rig) -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    stream = sse("message_start", {"type": "message_start"}) + sse("error", error)
    status, body, complete = rig.post([stream])
    assert (status, complete) == (200, True)
    assert parse_events(body)[-1] == ("error", orjson.dumps(error).decode())


def test_an_upstream_cut_reaches_the_client_as_a_cut(rig: Rig) -> None:
    start_event = sse("message_start", {"type": "message_start"})
    status, body, complete = rig.post([start_event, b"event: content_block_delta\nda", CUT])
    assert (status, complete) == (200, False)
    assert parse_events(body) == parse_events(start_event)


def test_a_silent_stream_ends_with_an_error_event(rig: Rig) -> None:
    start_event = sse("message_start", {"type": "message_start"})
    status, body, complete = rig.post([start_event, 30.0], quick=True)
    assert (status, complete) == (200, True)
    events = parse_events(body)
    assert events[0] == parse_events(start_event)[0]
    assert events[-1][0] == "error"
    assert orjson.loads(events[-1][1])["error"]["type"] == "api_error"


def test_a_stream_silent_inside_an_event_ends_with_an_error_event(rig: Rig) -> None:
    """The half event was held back (events are written whole), so the proxy ends the
    stream cleanly rather than cutting it."""
    start_event = sse("message_start", {"type": "message_start"})
    status, body, complete = rig.post([start_event, b"event: ping\nda", 30.0], quick=True)
    assert (status, complete) == (200, True)
    events = parse_events(body)
    assert events[0] == parse_events(start_event)[0]
    assert events[-1][0] == "error" and len(events) == 2
    assert b"event: ping" not in body


@pytest.mark.parametrize("first", [[], [b"event: ping\nda"]], ids=["nothing", "half an event"])
def test_the_headers_do_not_wait_for_the_first_event(rig: Rig, first: list[Any]) -> None:
    """The answer's headers go out with its first bytes only when those have arrived
    with them: an upstream that sends its headers and then nothing (or half an event)
    for a while has them relayed at once."""
    path = f"/v1/messages?case={next(rig.cases)}"
    rig.upstream.scripts[path] = [*first, 1.5, b"ta: {}\n\n" if first else sse("ping", {})]
    target = urlsplit(rig.proxy.url)
    connection = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
    try:
        began = time.monotonic()
        connection.request("POST", path, BODY, {"content-type": "application/json"})
        response = connection.getresponse()
        headed = time.monotonic() - began
        body = response.read()
    finally:
        connection.close()
    assert response.status == 200 and headed < 1.0
    assert parse_events(body) == [("ping", "{}")]


def test_the_end_does_not_wait_for_the_usage_reading(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The usage in bytes sent is read after the next bytes (or the end) went, not
    before the next read: a stream's end arriving apart from its last events reaches the
    client without waiting for them to be read, and their usage is still read."""
    held = 0.8  # seconds each reading of this stream holds the proxy's loop
    readings: list[bytes] = []
    chunk = UsageMeter.chunk
    stop = sse("message_stop", {"type": "message_stop", "case": "the end first"})

    def slow(self: UsageMeter, data: bytes) -> None:
        if b"the end first" in data:  # (not another test's stream the rig still ends)
            readings.append(data)
            time.sleep(held)
        chunk(self, data)

    monkeypatch.setattr(UsageMeter, "chunk", slow)
    began = time.monotonic()
    status, body, ended = rig.post([stop, 0.1])
    took = time.monotonic() - began
    assert status == 200 and ended and parse_events(body)[-1][0] == "message_stop"
    assert took < held / 2, f"the end waited for the usage reading ({took:.2f} s)"
    time.sleep(held * 1.5)
    assert readings == [stop]  # read after the end went
