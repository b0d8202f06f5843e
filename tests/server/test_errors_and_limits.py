"""Upstream errors pass through unchanged; the proxy's own errors have the API's shape."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest

from tests.plugins.standin import RunningStandIn
from tests.server.conftest import MakeProxy
from tests.server.rawhttp import open_connection, read_response, request_head, send

HEADERS = [
    ("x-api-key", "sk-test"),
    ("anthropic-version", "2023-06-01"),
    ("content-type", "application/json"),
]
REQUEST: dict[str, Any] = {
    "model": "claude-haiku-4-5",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "hello"}],
}


def api_error(body: bytes, kind: str) -> dict[str, Any]:
    error = orjson.loads(body)
    assert error["type"] == "error"
    assert error["error"]["type"] == kind
    assert error["error"]["message"]
    assert error["request_id"]
    return error


async def test_sdk_retry_on_429_works_through_the_proxy(
    standin: RunningStandIn, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(standin.url)
    script = '{"fault": "429", "fault_times": 1, "retry_after_ms": 10}'
    async with anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-test") as client:
        message = await client.messages.create(**REQUEST, extra_headers={"x-stand-in": script})
    assert message.content[0].type == "text"
    assert len(standin.recorded) == 2


@pytest.mark.parametrize("fault", ["429", "529", "500"])
async def test_upstream_error_statuses_pass_through_unchanged(
    fault: str, standin: RunningStandIn, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(standin.url)
    body = orjson.dumps(REQUEST)
    headers = [*HEADERS, ("x-stand-in", orjson.dumps({"fault": fault}).decode())]
    direct = await send(standin.url, "POST", "/v1/messages", headers, body)
    proxied = await send(proxy.url, "POST", "/v1/messages", headers, body)
    assert proxied.status == direct.status == int(fault)
    assert orjson.loads(proxied.body)["error"] == orjson.loads(direct.body)["error"]
    assert proxied.header("retry-after") == direct.header("retry-after")
    # The upstream's own request id, not one of the proxy's.
    request_id = proxied.header("request-id")
    assert request_id is not None and not request_id.startswith("req_proxy_")
    assert orjson.loads(proxied.body)["request_id"] == request_id


async def test_upstream_400_passes_through_with_its_message(
    standin: RunningStandIn, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(standin.url)
    body = orjson.dumps({**REQUEST, "messages": [{"role": "user", "content": "  "}]})
    direct = await send(standin.url, "POST", "/v1/messages?beta=true", HEADERS, body)
    proxied = await send(proxy.url, "POST", "/v1/messages?beta=true", HEADERS, body)
    assert proxied.status == direct.status == 400
    assert orjson.loads(proxied.body)["error"] == orjson.loads(direct.body)["error"]


async def test_sdk_sees_the_same_stream_error_and_cut(
    standin: RunningStandIn, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(standin.url)
    outcomes = []
    for base in (standin.url, proxy.url):
        async with anthropic.AsyncAnthropic(
            base_url=base, api_key="sk-test", max_retries=0
        ) as client:
            for fault in ("stream_error", "eof"):
                script = orjson.dumps({"fault": fault}).decode()
                seen: list[str] = []
                try:
                    stream = await client.messages.create(
                        **REQUEST, stream=True, extra_headers={"x-stand-in": script}
                    )
                    async for event in stream:
                        seen.append(event.type)
                    seen.append("ended")
                except anthropic.APIStatusError as e:
                    seen.append(f"status error {e.body}")
                except Exception as e:  # the stream broke: the same way both times?
                    seen.append(f"broken {type(e).__name__}")
                outcomes.append(seen)
    direct, proxied = outcomes[:2], outcomes[2:]
    assert proxied == direct
    assert "overloaded_error" in direct[0][-1]
    assert direct[1][-1].startswith("broken")


@pytest.mark.parametrize(
    ("body", "message"),
    [(b'{"model": "x", ', "not valid JSON"), (b"[1, 2]", "JSON object"), (b"", "not valid")],
)
async def test_bad_json_is_a_400(
    body: bytes, message: str, standin: RunningStandIn, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(standin.url)
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        headers = [*HEADERS, ("content-length", str(len(body)))]
        response = await send(proxy.url, "POST", path, headers, body)
        assert response.status == 400
        assert message in api_error(response.body, "invalid_request_error")["error"]["message"]
    assert standin.recorded == []


SMALL_BODY_LIMIT = {"server.max_body_bytes": 1000}


async def assert_refused_as_too_large(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, standin: RunningStandIn
) -> None:
    """The proxy's 413 in the API's shape, and nothing forwarded upstream."""
    response = await read_response(reader)
    writer.close()
    assert response.status == 413
    api_error(response.body, "request_too_large")
    assert standin.recorded == []


async def test_too_large_by_content_length_is_refused_before_reading(
    standin: RunningStandIn, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(standin.url, **SMALL_BODY_LIMIT)
    reader, writer = await open_connection(proxy.url)
    # Announce far more than the limit, send only a little: the answer must not wait.
    headers = [*HEADERS, ("content-length", str(10**9))]
    writer.write(request_head(proxy.url, "POST", "/v1/messages", headers) + b'{"model": ')
    await writer.drain()
    await assert_refused_as_too_large(reader, writer, standin)


async def test_too_large_with_expect_is_refused_before_the_upload(
    standin: RunningStandIn, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(standin.url, **SMALL_BODY_LIMIT)
    reader, writer = await open_connection(proxy.url)
    headers = [*HEADERS, ("content-length", "1001"), ("expect", "100-continue")]
    writer.write(request_head(proxy.url, "POST", "/v1/messages", headers))
    await writer.drain()
    first_line = await reader.readline()
    assert first_line.split()[1] == b"413"  # no 100 Continue first
    writer.close()

    reader, writer = await open_connection(proxy.url)
    body = orjson.dumps(REQUEST)
    headers = [*HEADERS, ("content-length", str(len(body))), ("expect", "100-continue")]
    writer.write(request_head(proxy.url, "POST", "/v1/messages", headers))
    await writer.drain()
    assert (await reader.readline()).split()[1] == b"100"
    await reader.readline()
    writer.write(body)
    response = await read_response(reader)
    writer.close()
    assert response.status == 200
    assert standin.recorded[-1].body == body


async def test_too_large_chunked_is_refused_once_over(
    standin: RunningStandIn, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(standin.url, **SMALL_BODY_LIMIT)
    reader, writer = await open_connection(proxy.url)
    writer.write(
        request_head(
            proxy.url, "POST", "/v1/messages", [*HEADERS, ("transfer-encoding", "chunked")]
        )
    )
    for _ in range(3):  # 1,200 bytes, and the body never ends
        writer.write(b"190\r\n" + b" " * 400 + b"\r\n")
    await writer.drain()
    await assert_refused_as_too_large(reader, writer, standin)


async def test_a_body_at_the_limit_is_forwarded(
    standin: RunningStandIn, make_proxy: MakeProxy
) -> None:
    body = orjson.dumps(REQUEST)
    proxy = await make_proxy(standin.url, **{"server.max_body_bytes": len(body)})
    headers = [*HEADERS, ("content-length", str(len(body)))]
    response = await send(proxy.url, "POST", "/v1/messages", headers, body)
    assert response.status == 200
    assert standin.recorded[-1].body == body


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_unreachable_upstream_is_a_retryable_502(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(f"http://127.0.0.1:{free_port()}")
    body = orjson.dumps(REQUEST)
    response = await send(proxy.url, "POST", "/v1/messages", HEADERS, body)
    assert response.status == 502
    assert response.header("x-should-retry") == "true"
    assert (
        "could not reach the upstream" in api_error(response.body, "api_error")["error"]["message"]
    )
    passthrough = await send(proxy.url, "GET", "/v1/models", HEADERS)
    assert passthrough.status == 502


async def test_silent_upstream_is_a_504(make_proxy: MakeProxy) -> None:
    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 20)
        await asyncio.sleep(30)

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        proxy = await make_proxy(f"http://127.0.0.1:{port}", **{"upstream.response_timeout": 0.3})
        url = f"{proxy.url}/v1/messages"
        async with aiohttp.ClientSession() as client, client.post(url, data=b"{}") as r:
            assert r.status == 504
            api_error(await r.read(), "api_error")
    finally:
        server.close()
